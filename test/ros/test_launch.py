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
"""launch/lingbot_map.launch.py: arguments, relative topics, installed config, node wiring.

Run: ``pytest test/ros/test_launch.py`` (under a second).

Without ``launch_ros`` (the PyPI-wheel CI) the file is checked statically: it compiles, declares
the documented arguments with descriptions, remaps only relative names, points at the installed
parameter file and starts an executable that ``setup.py`` installs. Where ``launch_ros`` and an
installed ``lingbot_map_ros`` are available (a ROS workspace), the LaunchDescription is really
built and its node action expanded.
"""

import ast
import importlib.util
from pathlib import Path

from lingbot_map_ros.ros.node import NODE_NAME
import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / 'launch' / 'lingbot_map.launch.py'
DOCUMENTED = ['namespace', 'params_file', 'use_sim_time', 'log_level', 'image_topic', 'weights']
SOURCE = LAUNCH.read_text()
TREE = ast.parse(SOURCE, filename=str(LAUNCH))


def string_tuples(size):
    """Every literal tuple of ``size`` elements whose first element is a string."""
    for node in ast.walk(TREE):
        if isinstance(node, ast.Tuple) and len(node.elts) == size and \
                isinstance(node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str):
            yield node


def node_keyword(name):
    """Value of the ``name=...`` keyword of the ``Node(...)`` action."""
    [call] = [n for n in ast.walk(TREE) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name) and n.func.id == 'Node']
    [value] = [kw.value for kw in call.keywords if kw.arg == name]
    return value


def test_compiles_and_stays_small():
    compile(SOURCE, str(LAUNCH), 'exec')
    assert any(isinstance(n, ast.FunctionDef) and n.name == 'generate_launch_description'
               for n in TREE.body)
    assert len(SOURCE.splitlines()) <= 70


def test_declares_the_documented_arguments_with_descriptions():
    declared = {}
    for node in string_tuples(3):
        description = node.elts[2]
        if isinstance(description, ast.BinOp):  # implicit concatenation is a Constant anyway
            description = None
        declared[node.elts[0].value] = description
    assert set(DOCUMENTED) <= set(declared)
    for name in DOCUMENTED:
        assert isinstance(declared[name], ast.Constant) and len(declared[name].value) > 10
    assert 'DeclareLaunchArgument' in SOURCE and "SetParameter(name='use_sim_time'" in SOURCE


def test_remaps_relative_names_only():
    remappings = node_keyword('remappings')
    sources = [elt.elts[0].value for elt in remappings.elts]
    assert sources == ['image', 'camera_info']
    defaults = {n.elts[0].value: n.elts[1] for n in string_tuples(3)}
    assert not defaults['image_topic'].value.startswith('/')
    assert defaults['namespace'].value == ''


def test_uses_the_installed_config_and_an_installed_executable():
    assert "get_package_share_directory('lingbot_map_ros')" in SOURCE
    assert "'lingbot_map.yaml'" in SOURCE and (ROOT / 'config' / 'lingbot_map.yaml').exists()
    setup = (ROOT / 'setup.py').read_text()
    assert "glob('config/*.yaml')" in setup and "glob('launch/*.launch.py')" in setup
    executable = node_keyword('executable')
    assert f'{executable.value} = lingbot_map_ros.ros.node:main' in setup
    name = node_keyword('name')
    assert name.value == NODE_NAME


def test_builds_a_launch_description_with_launch_ros():
    pytest.importorskip('launch_ros')
    from ament_index_python.packages import get_package_share_directory, PackageNotFoundError
    from launch import LaunchContext
    from launch.actions import DeclareLaunchArgument, OpaqueFunction
    try:
        get_package_share_directory('lingbot_map_ros')
    except PackageNotFoundError:
        pytest.skip('lingbot_map_ros is not installed in an ament index (colcon build first)')
    spec = importlib.util.spec_from_file_location('lingbot_map_launch', LAUNCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    declared = [e for e in description.entities if isinstance(e, DeclareLaunchArgument)]
    assert [a.name for a in declared] == DOCUMENTED
    context = LaunchContext()
    for arg in declared:
        context.launch_configurations[arg.name] = arg.default_value[0].perform(context)
    context.launch_configurations['weights'] = '/data/w.pt'
    [opaque] = [e for e in description.entities if isinstance(e, OpaqueFunction)]
    [node] = opaque.execute(context)
    assert (node.node_package, node.node_executable) == ('lingbot_map_ros', 'lingbot_map_node')
