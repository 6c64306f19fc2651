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
"""An image store given a folder it cannot use says so when built (#46 item 11).

The node refuses such a ``loop.image_folder`` at start (``test/ros/test_image_folder_param.py``);
the store's own error is for the engine's other callers (the replay tool).

Run: ``pytest test/engine/loop/test_image_store_folder.py`` (CPU; instant).
"""

from pathlib import Path

from lingbot_map_ros.engine.mapping.places.image_store import ImageStore
import pytest


def test_a_folder_that_cannot_be_created_is_refused_with_the_parameter(tmp_path: Path) -> None:
    (tmp_path / 'file').write_text('x')
    with pytest.raises(ValueError, match=r"loop.image_folder '.*/file/kf' cannot hold the "
                                         r'keyframe images: Not a directory'):
        ImageStore(1000, tmp_path / 'file' / 'kf')
    with pytest.raises(ValueError, match='cannot hold the keyframe images: No such file'):
        ImageStore(1000, '/proc/nope')
    store = ImageStore(1000, tmp_path / 'a' / 'kf')
    assert store.put(3, b'\xff\xd8jpeg') and (tmp_path / 'a' / 'kf' / '3.jpg').read_bytes() == \
        b'\xff\xd8jpeg'
