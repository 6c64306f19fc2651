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
"""``lingbot_map_node --help`` / ``lingbot_map_lifecycle_node --help`` print usage, not a FATAL.

Run: ``pytest test/ros/test_cli_help.py`` (instant).
"""

from pathlib import Path
import re
import subprocess
import sys

from lingbot_map_ros.ros.nodes import lifecycle_node, node
from lingbot_map_ros.ros.parameters import cli_help, interface, params
import pytest

_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize('main, exe', [(node.main, 'lingbot_map_node'),
                                       (lifecycle_node.main, 'lingbot_map_lifecycle_node')])
def test_help_prints_usage_and_every_parameter_without_starting_ros(main, exe, capsys):
    assert main([exe, '--help']) == 0
    out = capsys.readouterr().out
    assert out.startswith(f'usage: {exe} ')
    listed = [line.split(' = ', 1)[0].strip() for line in out.splitlines()
              if line.startswith('  ') and ' = ' in line]
    assert listed == [spec.name for spec in params.all_specs()]
    assert 'weights' in listed and 'FATAL' not in out


def test_help_is_only_recognised_before_ros_args():
    assert cli_help.wants_help(['-h'])
    assert cli_help.wants_help(['--help', '--ros-args', '-p', 'seed:=1'])
    assert not cli_help.wants_help(['--ros-args', '-r', '__node:=--help'])
    assert not cli_help.wants_help([])


@pytest.mark.parametrize('main, exe', [(node.main, 'lingbot_map_node'),
                                       (lifecycle_node.main, 'lingbot_map_lifecycle_node')])
def test_help_lists_the_nodes_interface_table_and_no_broken_reference(main, exe, capsys):
    # The table is the node's (test_ros_interface.py holds it to a running node).
    assert main([exe, '--help']) == 0
    out = capsys.readouterr().out
    head = out.split('Parameters (name')[0]
    for endpoint in interface.ENDPOINTS:
        assert f'  {endpoint.name} ({endpoint.type}): ' in head, endpoint
    for frames, _ in interface.TRANSFORMS:
        assert f'  {frames}: ' in head
    # Every file or page the text points to exists (a module reference reads as its file).
    for path in re.findall(r'(?:lingbot_map_ros|docs)/[\w/]+\.(?:py|md)', out):
        assert (_ROOT / path).is_file(), path
    # References rendered as bare module names, as the help once had them.
    for broken in ('depth_input).', '(map_output)', 'Parameters: params.', 'those of node;',
                   '(worker)', '(node_process)'):
        assert broken not in head, broken


def test_help_descriptions_state_the_defaults_the_table_has(capsys):
    # loop.verify_unit_interval's example was worked at 2 while the default is 3.
    assert node.main(['lingbot_map_node', '--help']) == 0
    out = capsys.readouterr().out
    spec = next(s for s in params.all_specs() if s.name == 'loop.verify_unit_interval')
    line = next(x for x in out.splitlines() if x.startswith(f'  {spec.name} = '))
    assert line.startswith(f'  {spec.name} = {spec.default}: ')
    assert f'at the default {spec.default})' in line


def test_help_into_a_pipe_closed_early_ends_quietly():
    # `lingbot_map_node --help | head -3`: here the reader is gone before the first byte.
    proc = subprocess.Popen([sys.executable, '-m', 'lingbot_map_ros.ros.nodes.entry', '--help'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    try:
        stderr = proc.stderr.read()
        assert proc.wait(timeout=300.0) == 0, stderr
    finally:
        proc.kill()
        proc.stderr.close()
    assert 'Traceback' not in stderr and 'BrokenPipe' not in stderr, stderr
