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
"""Unknown parameter names are refused at start, with the nearest known names (issue #38).

One check (``params.check_names`` over ``param_names.unknown_problem``) for the node, the
lifecycle node and the tools. The node processes run with the real rclpy of this venv; CI runs
the file on Kilted and Jazzy (``scripts/test.sh``). Run: ``pytest test/ros/test_unknown_params.py``
(the process tests import torch: ~10 s each on 2 cores).
"""

from __future__ import annotations

from pathlib import Path
import subprocess
import sys

from lingbot_map_ros.ros.parameters import node_params, param_names, params
from node_harness import TINY_CPU
import pytest
from rclpy.node import Node
from rclpy.parameter import Parameter

pytestmark = pytest.mark.rostest
ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / 'config' / 'demo_tiny_cpu.yaml'


def test_the_nearest_names_are_offered():
    known = params.known_names()
    assert param_names.unknown_problem(['cache.scale_frames', 'use_sim_time'], known) is None
    cases = {'stream.image_widht': 'did you mean stream.image_width?',
             'cache.scale_frame': 'did you mean cache.scale_frames?',
             'cache.keyframe_interval': 'did you mean stream.keyframe_interval?',
             'zzz': 'no similar name'}
    for name, hint in cases.items():
        problem = param_names.unknown_problem([name], known)
        assert problem == (f"unknown parameter '{name}' ({hint}); docs/parameters.md lists "
                           'every parameter'), problem
    removed = param_names.unknown_problem(['frames.map_axes'], known)
    assert 'removed' in removed and '--map-axes' in removed


def test_camera_mountings_are_known_only_for_configured_cameras():
    mount = 'frames.cameras.front.base_to_camera'
    params.check_names([mount], cameras=['front'])
    with pytest.raises(ValueError, match="unknown parameter 'frames.cameras.front"):
        params.check_names([mount], cameras=['left'])


@pytest.mark.parametrize('overrides', [
    {'stream.image_widht': 320},
    {'cache.scale_frame': 4, 'publish.clod': True},
])
def test_declare_all_refuses_given_unknown_names(context, overrides):
    node = Node('lingbot_map', context=context, namespace='/unknown_check',
                parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])
    try:
        with pytest.raises(ValueError) as info:
            node_params.declare_all(node)
    finally:
        node.destroy_node()
    for name in overrides:
        assert f"'{name}'" in str(info.value)
    assert 'did you mean' in str(info.value)


def test_the_node_class_refuses_a_typo_before_loading_anything(context):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode
    values = {**TINY_CPU, 'stream.image_widht': 112}
    with pytest.raises(ValueError, match=r"'stream.image_widht' \(did you mean "
                                         r'stream.image_width\?\)'):
        LingbotMapNode(context=context, namespace='/unknown_class',
                       parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


def _run(exe_module: str, *ros_args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    code = f'import sys\nfrom {exe_module} import main\nsys.exit(main())\n'
    return subprocess.run([sys.executable, '-c', code, '--ros-args', *ros_args],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)


def _check_refusal(result: subprocess.CompletedProcess, name: str, nearest: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert 'Traceback' not in output, output
    fatal = [line for line in output.splitlines() if '[FATAL]' in line]
    assert len(fatal) == 1, output
    assert f"unknown parameter '{name}' (did you mean {nearest}?)" in fatal[0], fatal


@pytest.mark.slow
@pytest.mark.parametrize('module', ['lingbot_map_ros.ros.nodes.entry',
                                    'lingbot_map_ros.ros.nodes.lifecycle_node'])
def test_a_process_refuses_a_misspelled_p_with_one_fatal_line(module, tmp_path):
    result = _run(module, '--params-file', str(DEMO), '-p', 'stream.image_widht:=320',
                  tmp_path=tmp_path)
    _check_refusal(result, 'stream.image_widht', 'stream.image_width')


@pytest.mark.slow
def test_a_process_refuses_a_misspelled_key_of_a_params_file(tmp_path):
    text = DEMO.read_text(encoding='utf-8').replace('    cache:\n', '    cache:\n'
                                                    '      scale_frame: 4\n', 1)
    assert 'scale_frame: 4' in text
    params_file = tmp_path / 'typo.yaml'
    params_file.write_text(text, encoding='utf-8')
    result = _run('lingbot_map_ros.ros.nodes.entry', '--params-file', str(params_file),
                  tmp_path=tmp_path)
    _check_refusal(result, 'cache.scale_frame', 'cache.scale_frames')


def test_replay_refuses_the_same_names_with_the_same_words(tmp_path):
    from lingbot_map_ros.tools import replay
    args = replay.build_parser().parse_args(
        ['run', 'bag', '--out', str(tmp_path), '--params-file', str(DEMO),
         '--set', 'cache.scale_frame=4'])
    with pytest.raises(ValueError, match=r"--set: unknown parameter 'cache.scale_frame' \(did "
                                         r'you mean cache.scale_frames\?\)'):
        replay.run_options(args)
    args.set = ['frames.map_axes=optical']
    with pytest.raises(ValueError, match='removed'):
        replay.run_options(args)
    args.set = ['map.voxel_size=0.05', 'input.forward_jump_s=0.2']  # node keys, all known
    values, options = replay.run_options(args)
    assert abs(values['map.voxel_size'] - 0.05) < 1e-12 and options.map_axes == 'flu'
