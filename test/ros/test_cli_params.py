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
"""``-p`` values of the wrong type are refused before rclpy starts, naming the parameter."""

import subprocess
import sys

from lingbot_map_ros.ros.parameters import cli_params
import pytest


@pytest.mark.parametrize('text, kind', [
    ('3', 'integer'), ('-7', 'integer'), ('3.5', 'double'), ('1e3', 'double'), ('.5', 'double'),
    ('true', 'bool'), ('False', 'bool'), ('on', 'bool'), ('three', 'string'), ("'3'", 'string'),
    ('/tmp/x.pt', 'string'), ('cuda:0', 'string'), ('[1, 2]', 'integer array'),
    ('[1.0, 2.5]', 'double array'), ('[a, b]', 'string array'), ('[]', None),
    ('[1, 2.5]', None)])
def test_a_value_is_typed_as_rcl_reads_it(text, kind):
    assert cli_params.value_type(text) == kind


def test_only_the_rules_of_ros_args_sections_for_this_node_count():
    argv = ['exe', '-p', 'loop.candidates:=1', '--ros-args', '-p', 'a:=1', '--param',
            'lingbot_map:b:=2', '-p', '/ns/lingbot_map:c:=3', '-p', 'other:d:=4', '-p',
            '**:e:=5', '-r', 'x:=y', '--', '-p', 'f:=6', '--ros-args', '-p', 'g:=stream.x:=1']
    assert list(cli_params.overrides(argv, 'lingbot_map')) == [
        ('a', '1'), ('b', '2'), ('c', '3'), ('e', '5'), ('g', 'stream.x:=1')]


@pytest.mark.parametrize('rule, expected', [
    ('loop.candidates:=3.5', 'loop.candidates takes an integer, not a double'),
    ('loop.candidates:=three', 'loop.candidates takes an integer, not a string'),
    ('stream.keyframe_interval:=abc', 'stream.keyframe_interval takes an integer, not a string'),
    ('lingbot_map:publish.tf:=2', 'publish.tf takes a bool, not an integer'),
    ('weights:=12', 'weights takes a string, not an integer'),
])
def test_a_wrong_type_is_refused_with_the_name_and_the_type(rule, expected):
    problem = cli_params.type_problem(['exe', '--ros-args', '-p', rule], 'lingbot_map')
    assert problem is not None and problem.startswith('-p ') and expected in problem


@pytest.mark.parametrize('rule', [
    'loop.candidates:=4', 'publish.tf:=false', "weights:='12'", 'weights:=/w.pt',
    'input.cameras:=[]', 'input.cameras:=[front, back]', 'other:loop.candidates:=3.5',
    'no.such.name:=3.5'])
def test_right_types_other_nodes_and_unknown_names_pass(rule):
    # (unknown names are refused at start by their own check, with the nearest known names)
    assert cli_params.type_problem(['exe', '--ros-args', '-p', rule], 'lingbot_map') is None


_RUN = """
import sys
from pathlib import Path
from lingbot_map_ros.ros.nodes import node_process
from lingbot_map_ros.ros.nodes.process_signals import ProcessSignals


class NeverBuilt:
    def __init__(self):
        print('NODE BUILT', flush=True)


signals = ProcessSignals()
yaml = str(Path('config/demo_tiny_cpu.yaml').resolve())
for rule in sys.argv[1:]:
    rc = node_process.run(['node', '--ros-args', '--params-file', yaml, '-p', rule],
                          NeverBuilt, 'node', signals)
    print('rc', rc, flush=True)
"""


def test_the_node_process_refuses_a_wrong_typed_p_that_the_params_file_shadows():
    # config/demo_tiny_cpu.yaml sets both: rcl alone would start with the file's values.
    rules = ['loop.candidates:=3.5', 'loop.candidates:=three', 'stream.keyframe_interval:=abc']
    done = subprocess.run([sys.executable, '-c', _RUN, *rules], capture_output=True, text=True,
                          timeout=300.0)
    assert done.stdout.splitlines() == ['rc 1'] * 3, done.stdout + done.stderr
    for name, got in [('loop.candidates', 'double'), ('loop.candidates', 'string'),
                      ('stream.keyframe_interval', 'string')]:
        assert f'cannot start: -p {name}:=' in done.stderr
        assert f'{name} takes an integer, not a {got}' in done.stderr


def _params_file(tmp_path, name, top_key):
    path = tmp_path / name
    path.write_text(f'{top_key}:\n  ros__parameters:\n    weights: /w.pt\n', encoding='utf-8')
    return str(path)


def test_a_params_file_without_a_section_for_the_node_is_named_with_the_key_it_needs(tmp_path):
    wrong = _params_file(tmp_path, 'wrong.yaml', 'lingbot_map_node')
    (problem,) = cli_params.params_file_problems(
        ['exe', '--ros-args', '--params-file', wrong], 'lingbot_map')
    assert problem.startswith(f'--params-file {wrong}: no section for this node')
    assert "its top keys are 'lingbot_map_node'" in problem
    assert "the node 'lingbot_map' reads 'lingbot_map:'" in problem
    # A remapped node name is the one looked for.
    (renamed,) = cli_params.params_file_problems(
        ['exe', '--ros-args', '-r', '__node:=mapper', '--params-file', wrong], 'lingbot_map')
    assert "the node 'mapper' reads 'mapper:'" in renamed


@pytest.mark.parametrize('top_key', ['lingbot_map', '/lingbot_map', '/robot/lingbot_map',
                                     '/**', '"**"', '/*/lingbot_map', '/**/lingbot_map'])
def test_a_section_that_can_name_the_node_passes(tmp_path, top_key):
    path = _params_file(tmp_path, 'ok.yaml', top_key)
    assert cli_params.params_file_problems(
        ['exe', '--ros-args', '--params-file', path], 'lingbot_map') == []


def test_an_unreadable_params_file_is_left_to_rcl(tmp_path):
    bad = tmp_path / 'bad.yaml'
    bad.write_text('a: [unclosed\n', encoding='utf-8')
    argv = ['exe', '--ros-args', '--params-file', str(bad), '--params-file',
            str(tmp_path / 'none.yaml')]
    assert cli_params.params_file_problems(argv, 'lingbot_map') == []
