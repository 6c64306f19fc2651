# Copyright 2026 The lingbot_map_ros Authors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""An unusable ``loop.image_folder`` is refused at start, naming the parameter (#46 item 11).

Before, ``/etc/hostname`` or ``/proc/nope`` were accepted and every keyframe then failed to
store its image; an unset ``$VAR`` made a literal ``$VAR`` folder.

Run: ``pytest test/ros/test_image_folder_param.py`` (real rclpy, tiny CPU model; seconds).
"""

from __future__ import annotations

import os
from pathlib import Path

from lingbot_map_ros.ros.parameters import params
from node_harness import TINY_CPU
import pytest
from rclpy.parameter import Parameter


def _check(value: str) -> str | None:
    spec = next(s for s in params.all_specs('tiny') if s.name == 'loop.image_folder')
    return params.check_value(spec, value)


def test_the_reasons_name_the_parameter_and_the_problem(tmp_path: Path) -> None:
    (tmp_path / 'file').write_text('x')
    assert _check(str(tmp_path / 'file')) == (
        f"loop.image_folder='{tmp_path / 'file'}' is not a folder: the keyframe images cannot "
        "be stored (set another folder, or '' to keep them in RAM)")
    inside = _check(str(tmp_path / 'file' / 'images'))
    assert inside.startswith(f"loop.image_folder='{tmp_path / 'file' / 'images'}' is inside "
                             f"'{tmp_path / 'file'}', which is not a folder")
    assert _check('/proc/nope').startswith(
        "loop.image_folder='/proc/nope': cannot write a file there (in '/proc', to create it)")
    os.environ.pop('LINGBOT_UNSET_IMAGES', None)
    assert _check('$LINGBOT_UNSET_IMAGES/jpegs') == (
        "loop.image_folder='$LINGBOT_UNSET_IMAGES/jpegs' holds $LINGBOT_UNSET_IMAGES, which is "
        "not set in the node's environment")
    assert _check('${LINGBOT_UNSET_IMAGES}') is not None
    # Usable: an existing folder, a folder to create (the check creates nothing), RAM.
    assert _check(str(tmp_path)) is None
    assert _check(str(tmp_path / 'new' / 'images')) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ['file']
    assert _check('') is None
    long = _check('/proc/' + 'x' * 100_000)
    assert long is not None and len(long) < 600  # the value is echoed bounded


@pytest.mark.parametrize('value', ['/etc/hostname', '/proc/nope', '$LINGBOT_UNSET_IMAGES/j'])
def test_the_node_refuses_to_start(graph, value) -> None:
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    overrides = [Parameter(k, value=v) for k, v in TINY_CPU.items()]
    overrides.append(Parameter('loop.image_folder', value=value))
    with pytest.raises(ValueError) as refused:
        LingbotMapNode(context=graph.context, namespace=f'/if_{abs(hash(value))}',
                       parameter_overrides=overrides)
    message = str(refused.value)
    assert message.startswith(f'loop.image_folder={value!r}') and '\n' not in message


def test_the_node_starts_with_a_usable_folder(graph, tmp_path: Path) -> None:
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    overrides = [Parameter(k, value=v) for k, v in TINY_CPU.items()]
    overrides.append(Parameter('loop.image_folder', value=str(tmp_path / 'jpegs')))
    node = LingbotMapNode(context=graph.context, namespace='/if_ok',
                          parameter_overrides=overrides)
    try:
        assert node.get_parameter('loop.image_folder').value == str(tmp_path / 'jpegs')
    finally:
        node.destroy_node()
