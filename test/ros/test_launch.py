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
"""launch/lingbot_map.launch.py started for real through ``LaunchService``.

Run: ``pytest test/ros/test_launch.py`` (30-60 s on 2 cores: each launch starts a node process).

The package is laid out as ``colcon build`` installs it (ament index entry, share/ with launch,
config and package.xml, lib/lingbot_map_ros/ executables) in a temporary prefix on
``AMENT_PREFIX_PATH``; the executables run this interpreter, so the node is this checkout's.
Each test launches the file with arguments (tiny CPU model, random weights), publishes images on
the remapped topic from a probe node, and checks the poses that come out (stamps, frame ids),
the node's name, namespace and remaps in the ROS graph, and its parameters through its parameter
service. Needs the launch wheels (``../shared/wheels/launch``, installed by scripts/bootstrap.sh);
skips without them.
"""

import ast
import itertools
import os
from pathlib import Path
import sys
import threading
import time

from lingbot_map_ros.ros.nodes.node import NODE_NAME
from node_harness import Graph, image_msg, make_image, TINY_CPU, wait_for
import pytest
import yaml

pytestmark = [pytest.mark.rostest, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / 'launch' / 'lingbot_map.launch.py'
DOCUMENTED = ['namespace', 'params_file', 'use_sim_time', 'log_level', 'image_topic', 'weights',
              'allow_random_weights', 'odom_frame', 'base_frame', 'map_frame', 'camera_frame',
              'publish_tf', 'transport', 'cameras', 'depth_topic', 'loop_closure',
              'map_load_path', 'map_mode', 'grid', 'lifecycle', 'autostart', 'rviz']
EXECUTABLES = {'lingbot_map_node': 'lingbot_map_ros.ros.nodes.entry',
               'lingbot_map_lifecycle_node': 'lingbot_map_ros.ros.nodes.lifecycle_node'}
_TIMEOUT_S = 120.0  # a node process importing torch on a loaded 2-core machine
# ros2 launch escalates to SIGTERM this long after its SIGINT (its sigterm_timeout default).
_LAUNCH_SIGTERM_AFTER_S = 5.0
_ns = itertools.count()


def test_declares_the_documented_arguments_and_setup_installs_the_executables():
    tree = ast.parse(LAUNCH.read_text())
    [arguments] = [n for n in tree.body if isinstance(n, ast.FunctionDef)
                   and n.name == 'arguments']
    declared = [t.elts[0].value for t in ast.walk(arguments)
                if isinstance(t, ast.Tuple) and len(t.elts) == 3]
    assert declared == DOCUMENTED
    setup = (ROOT / 'setup.py').read_text()
    for exe, module in EXECUTABLES.items():
        assert f"'{exe} = {module}:main'" in setup
    assert "glob('rviz/*.rviz')" in setup and "glob('launch/*.launch.py')" in setup


@pytest.fixture(scope='module')
def prefix(tmp_path_factory):
    """Build an install prefix shaped like colcon's, on AMENT_PREFIX_PATH for this module."""
    pytest.importorskip('launch_ros')
    root = tmp_path_factory.mktemp('install')
    index = root / 'share' / 'ament_index' / 'resource_index' / 'packages'
    index.mkdir(parents=True)
    (index / 'lingbot_map_ros').write_text('')
    share = root / 'share' / 'lingbot_map_ros'
    share.mkdir()
    for name in ('launch', 'config', 'package.xml'):
        (share / name).symlink_to(ROOT / name)
    lib = root / 'lib' / 'lingbot_map_ros'
    lib.mkdir(parents=True)
    for exe, module in EXECUTABLES.items():
        script = lib / exe
        script.write_text(f'#!{sys.executable}\nimport sys\nfrom {module} import main\n'
                          'sys.exit(main())\n')
        script.chmod(0o755)
    saved = {k: os.environ.get(k) for k in ('AMENT_PREFIX_PATH', 'OMP_NUM_THREADS')}
    os.environ['AMENT_PREFIX_PATH'] = os.pathsep.join(
        p for p in (str(root), saved['AMENT_PREFIX_PATH']) if p)
    os.environ['OMP_NUM_THREADS'] = '1'  # the node process: no thread spinning on 2 cores
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope='module')
def params_file(tmp_path_factory):
    """demo_tiny_cpu.yaml with the test engine (small images) and bag-mode input."""
    doc = yaml.safe_load((ROOT / 'config' / 'demo_tiny_cpu.yaml').read_text())
    values = doc['/**']['ros__parameters']
    overrides = {**TINY_CPU, 'input.queue_mode': 'bag', 'input.qos.reliability': 'reliable',
                 'input.qos.depth': 100, 'allow_random_weights': False}
    for dotted, value in overrides.items():
        *sections, key = dotted.split('.')
        node = values
        for section in sections:
            node = node[section]
        node[key] = value
    path = tmp_path_factory.mktemp('launch_params') / 'params.yaml'
    path.write_text(yaml.safe_dump(doc))
    return path


def launch(arguments, check):
    """Run the launch file with ``arguments`` in this (main) thread, ``check()`` beside it.

    After ``check`` the launch is shut down as Ctrl-C on ``ros2 launch`` does: SIGINT to each
    process, SIGTERM 5 s later if it is still there.

    Returns:
        What ``check`` returned, and ``(seconds from the shutdown to the exit, exit status)`` of
        every launched process; ``check``'s exception is raised here after the launch has ended.
    """
    from launch import LaunchDescription, LaunchService
    from launch.actions import IncludeLaunchDescription, RegisterEventHandler
    from launch.event_handlers import OnProcessExit
    from launch.launch_description_sources import PythonLaunchDescriptionSource
    service = LaunchService()
    exits = []
    service.include_launch_description(LaunchDescription([
        RegisterEventHandler(OnProcessExit(on_exit=lambda event, _context: exits.append(
            (time.monotonic(), event.returncode)))),
        IncludeLaunchDescription(PythonLaunchDescriptionSource(str(LAUNCH)),
                                 launch_arguments=arguments.items())]))
    outcome = {}

    def run_check():
        try:
            outcome['value'] = check()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            outcome['error'] = exc
        finally:
            outcome['shutdown_at'] = time.monotonic()
            service.shutdown()
    thread = threading.Thread(target=run_check, daemon=True)
    thread.start()
    service.run(shutdown_when_idle=False)  # LaunchService must own the main thread
    thread.join(30.0)
    if 'error' in outcome:
        raise outcome['error']
    return outcome['value'], [(at - outcome['shutdown_at'], code) for at, code in exits]


def check_clean_stop(stops):
    """Check that the node exited with status 0 within 5 s of the SIGINT (before any SIGTERM)."""
    assert len(stops) == 1 and stops[0][1] == 0, stops
    assert stops[0][0] < _LAUNCH_SIGTERM_AFTER_S, stops


def probe_launch(namespace, num_images):
    """Publish images to the launched node, collect poses, graph facts and parameters."""
    from geometry_msgs.msg import PoseStamped
    from rcl_interfaces.srv import GetParameters
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image
    graph = Graph()
    try:
        probe = graph.add(graph_node(graph, namespace))
        reliable = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
        pub = probe.create_publisher(Image, 'cam/image_raw', reliable)
        poses = []
        pose_sub = probe.create_subscription(PoseStamped, 'lingbot_map/pose', poses.append,
                                             reliable)
        wait_for(lambda: pub.get_subscription_count() > 0 and
                 pose_sub.get_publisher_count() > 0, _TIMEOUT_S, 'the launched node')
        stamps = [2_000_000_000 + i * 100_000_000 for i in range(num_images)]
        for i, stamp in enumerate(stamps):
            pub.publish(image_msg(make_image(i), stamp))
        wait_for(lambda: len(poses) >= num_images, _TIMEOUT_S, f'{num_images} poses')
        client = probe.create_client(GetParameters, 'lingbot_map/get_parameters')
        names = ['frames.odom_frame', 'frames.map_frame', 'publish.tf', 'allow_random_weights',
                 'model.preset', 'use_sim_time', 'input.transport', 'loop.enable',
                 'grid.enable', 'map.mode']
        wait_for(lambda: client.wait_for_service(timeout_sec=0.1), _TIMEOUT_S, 'parameters')
        future = client.call_async(GetParameters.Request(names=names))
        wait_for(future.done, _TIMEOUT_S, 'get_parameters')
        values = [_value(v) for v in future.result().values]
        return {'poses': list(poses), 'stamps': stamps,
                'params': dict(zip(names, values)),
                'nodes': probe.get_node_names_and_namespaces(),
                'info_subs': probe.count_subscribers(f'{namespace}/cam/camera_info')}
    finally:
        graph.close()


def graph_node(graph, namespace):
    from rclpy.node import Node
    return Node(f'launch_probe_{next(_ns)}', namespace=namespace, context=graph.context)


def _value(msg):
    from rclpy.parameter import parameter_value_to_python
    return parameter_value_to_python(msg)


def check_outputs(got, namespace, map_frame):
    assert (NODE_NAME, namespace) in got['nodes']
    assert got['info_subs'] == 1  # camera_info remapped next to the image topic
    poses = got['poses'][:len(got['stamps'])]
    assert [p.header.stamp.sec * 1_000_000_000 + p.header.stamp.nanosec for p in poses] == \
        got['stamps']
    assert {p.header.frame_id for p in poses} == {map_frame}


def test_launch_starts_the_node_with_arguments_remaps_and_parameters(prefix, params_file):
    namespace = f'/launch{next(_ns)}'
    got, stops = launch({'namespace': namespace, 'params_file': str(params_file),
                         'image_topic': 'cam/image_raw', 'allow_random_weights': 'true',
                         'odom_frame': 'odom_lt', 'map_frame': 'map_lt', 'publish_tf': 'false',
                         'log_level': 'warn', 'loop_closure': 'false', 'grid': 'false',
                         'map_mode': 'localization'},
                        lambda: probe_launch(namespace, 4))
    check_outputs(got, namespace, 'odom_lt')
    check_clean_stop(stops)
    assert got['params'] == {'frames.odom_frame': 'odom_lt', 'frames.map_frame': 'map_lt',
                             'publish.tf': False,
                             'allow_random_weights': True, 'model.preset': 'tiny',
                             'use_sim_time': False, 'input.transport': 'raw',
                             'loop.enable': False, 'grid.enable': False,
                             'map.mode': 'localization'}


def test_mapping_arguments_become_node_parameters():
    pytest.importorskip('launch_ros')
    import importlib.util
    spec = importlib.util.spec_from_file_location('lingbot_map_launch_file', LAUNCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    given = {'loop_closure': 'true', 'map_load_path': '/maps/lab', 'map_mode': 'localization',
             'grid': 'false', 'depth_topic': '/cam/depth'}
    values = module._overrides(lambda name: given.get(name, ''))
    assert values == {'loop.enable': True, 'map.load_path': '/maps/lab',
                      'map.mode': 'localization', 'grid.enable': False,
                      'metric.source': 'depth', 'stream.enable_depth': True}
    # Empty arguments keep the parameter file's values.
    assert module._overrides(lambda name: '') == {}
    from lingbot_map_ros.ros.parameters.params import all_specs
    declared = {s.name for s in all_specs()}
    assert set(module.OVERRIDES.values()) <= declared


def test_launch_lifecycle_autostart_configures_and_activates(prefix, params_file):
    namespace = f'/launch{next(_ns)}'
    got, stops = launch({'namespace': namespace, 'params_file': str(params_file),
                         'image_topic': 'cam/image_raw', 'allow_random_weights': 'true',
                         'lifecycle': 'true', 'log_level': 'warn'},
                        lambda: probe_launch(namespace, 3))
    check_outputs(got, namespace, 'odom')
    check_clean_stop(stops)
    assert got['params']['allow_random_weights'] is True


def probe_cameras(namespace, names, num_images):
    """Publish ``num_images`` to each camera's topic (``{name: topic}``); collect the poses."""
    from geometry_msgs.msg import PoseStamped
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image
    graph = Graph()
    try:
        probe = graph.add(graph_node(graph, namespace))
        reliable = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
        pubs = [probe.create_publisher(Image, topic, reliable) for topic in names.values()]
        poses = {topic: [] for topic in ['pose'] + [f'{n}/pose' for n in names]}
        subs = [probe.create_subscription(PoseStamped, f'lingbot_map/{topic}', store.append,
                                          reliable) for topic, store in poses.items()]
        wait_for(lambda: all(p.get_subscription_count() > 0 for p in pubs) and
                 all(s.get_publisher_count() > 0 for s in subs), _TIMEOUT_S, 'the node')
        stamps = [2_000_000_000 + i * 100_000_000 for i in range(num_images)]
        for i, stamp in enumerate(stamps):
            for k, pub in enumerate(pubs):
                pub.publish(image_msg(make_image(i + 20 * k), stamp))
        wait_for(lambda: all(len(v) >= num_images for v in poses.values()), _TIMEOUT_S,
                 'poses of every camera')
        return {topic: [p.header.stamp.sec * 1_000_000_000 + p.header.stamp.nanosec
                        for p in store] for topic, store in poses.items()}, stamps
    finally:
        graph.close()


def test_launch_cameras_argument_starts_one_node_for_several_cameras(prefix, params_file):
    namespace = f'/launch{next(_ns)}'
    (got, stamps), stops = launch({'namespace': namespace, 'params_file': str(params_file),
                                   'cameras': 'front,left=cam_left/image_raw',
                                   'allow_random_weights': 'true', 'log_level': 'warn'},
                                  lambda: probe_cameras(namespace, {'front': 'front/image',
                                                                    'left': 'cam_left/image_raw'},
                                                        3))
    check_clean_stop(stops)
    assert got == {'pose': stamps, 'front/pose': stamps, 'left/pose': stamps}


def test_rviz_is_skipped_with_a_message_when_rviz2_is_missing(prefix, monkeypatch):
    import importlib.util
    from launch.actions import LogInfo
    spec = importlib.util.spec_from_file_location('lingbot_map_launch', LAUNCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.shutil, 'which', lambda _name: None)
    action = module.rviz_action()
    assert isinstance(action, LogInfo)
    monkeypatch.setattr(module.shutil, 'which', lambda _name: '/usr/bin/rviz2')
    node = module.rviz_action()
    assert (node.node_package, node.node_executable) == ('rviz2', 'rviz2')
