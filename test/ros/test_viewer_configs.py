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
"""The RViz config and the Foxglove layout show what the node publishes, by its real names.

A real lingbot_map_node (tiny CPU model; depth, cloud and loop closure on, so every output
exists) starts in the root namespace with the launch file's default image remap; its own
publishers and subscriptions, read from the ROS graph, are the table every topic named in
``rviz/lingbot_map.rviz`` and ``foxglove/lingbot_map.json`` is checked against (name, message
type, and transient local where the node latches), so the layouts cannot drift from the node
again. Both show the image, the depth image, ``~/map``, ``~/grid``, ``~/map_path``,
``~/map_pose`` with its covariance, ``~/loop_closures`` and TF; "2D Pose Estimate" publishes
``/initialpose``.

Run: ``pytest test/ros/test_viewer_configs.py`` (a few seconds; marker ``rostest``).
"""

import ast
import json
from pathlib import Path

from lingbot_map_ros.ros.nodes.node import NODE_NAME
from node_harness import TINY_CPU
import pytest
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy
import yaml

pytestmark = pytest.mark.rostest

ROOT = Path(__file__).resolve().parents[2]
SHOWN = {'map', 'grid', 'map_path', 'map_pose', 'loop_closures', 'depth/image', 'path', 'pose'}
"""Outputs both layouts show (``~/<name>``)."""
RVIZ_TYPES = {
    'rviz_default_plugins/PointCloud2': 'sensor_msgs/msg/PointCloud2',
    'rviz_default_plugins/Path': 'nav_msgs/msg/Path',
    'rviz_default_plugins/Pose': 'geometry_msgs/msg/PoseStamped',
    'rviz_default_plugins/PoseWithCovariance': 'geometry_msgs/msg/PoseWithCovarianceStamped',
    'rviz_default_plugins/Image': 'sensor_msgs/msg/Image',
    'rviz_default_plugins/Map': 'nav_msgs/msg/OccupancyGrid',
    'rviz_default_plugins/MarkerArray': 'visualization_msgs/msg/MarkerArray',
}
"""The message type each RViz display class reads."""


def launch_image_topic() -> str:
    """Return the launch file's default ``image_topic`` (the node's remapped ``image``)."""
    tree = ast.parse((ROOT / 'launch' / 'lingbot_map.launch.py').read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and len(node.elts) == 3 and \
                getattr(node.elts[0], 'value', None) == 'image_topic':
            return '/' + node.elts[1].value.lstrip('/')
    raise AssertionError('no image_topic argument in the launch file')


@pytest.fixture(scope='module')
def node_topics(graph):
    """Return the node's (publishers {name: (type, latched)}, subscriptions {name: type})."""
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    image = launch_image_topic()
    values = {**TINY_CPU, 'stream.enable_depth': True, 'publish.depth': True,
              'publish.cloud': True, 'loop.enable': True}
    node = graph.add(LingbotMapNode(
        context=graph.context, parameter_overrides=[Parameter(k, value=v)
                                                    for k, v in values.items()],
        cli_args=['--ros-args', '-r', f'image:={image}']))
    assert node.get_fully_qualified_name() == f'/{NODE_NAME}'
    pubs = {}
    for name, types in node.get_publisher_names_and_types_by_node(NODE_NAME, '/'):
        info = [i for i in node.get_publishers_info_by_topic(name)
                if i.node_name == NODE_NAME]
        latched = any(i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL
                      for i in info)
        pubs[name] = (types[0], latched)
    subs = {name: types[0]
            for name, types in node.get_subscriber_names_and_types_by_node(NODE_NAME, '/')}
    yield pubs, subs
    graph.remove(node)


def test_rviz_displays_name_topics_the_node_publishes(node_topics):
    pubs, subs = node_topics
    config = yaml.safe_load((ROOT / 'rviz' / 'lingbot_map.rviz').read_text())
    manager = config['Visualization Manager']
    assert manager['Global Options']['Fixed Frame'] == 'map'
    displays = manager['Displays']
    shown = set()
    for display in displays:
        if 'Topic' not in display:
            continue
        topic, kind = display['Topic']['Value'], RVIZ_TYPES[display['Class']]
        if topic in pubs:
            assert pubs[topic][0] == kind, (display['Name'], topic, pubs[topic])
            # A latched output needs a transient local display, or RViz misses it.
            durability = display['Topic']['Durability Policy']
            assert durability == ('Transient Local' if pubs[topic][1] else 'Volatile'), \
                (display['Name'], topic)
            shown.add(topic)
        else:
            assert subs.get(topic) == kind, f"{display['Name']}: {topic} is not the node's"
            shown.add(topic)
    assert {f'/{NODE_NAME}/{name}' for name in SHOWN} | {launch_image_topic()} <= shown
    classes = {d['Class'] for d in displays}
    assert 'rviz_default_plugins/TF' in classes
    [pose] = [d for d in displays if d['Class'].endswith('/PoseWithCovariance')]
    assert pose['Covariance']['Value'] is True
    [initial] = [t for t in manager['Tools'] if t['Class'].endswith('/SetInitialPose')]
    assert initial['Topic']['Value'] == '/initialpose'


def test_foxglove_panels_name_topics_the_node_publishes(node_topics):
    pubs, subs = node_topics
    layout = json.loads((ROOT / 'foxglove' / 'lingbot_map.json').read_text())
    panels = layout['configById']
    named = set()
    for key, panel in panels.items():
        named |= set(panel.get('topics', {}))
        image = panel.get('imageMode', {})
        named |= {image[k] for k in ('imageTopic', 'calibrationTopic') if k in image}
        if 'topicToRender' in panel:
            named.add(panel['topicToRender'])
        publish = panel.get('publish')
        if publish:  # what a click publishes: the pose estimate only
            assert publish['type'] == 'pose_estimate' and \
                publish['poseEstimateTopic'] == '/initialpose', key
            assert not {k for k in publish if k.endswith('Topic')} - {'poseEstimateTopic'}, key
    unknown = {t for t in named if t not in pubs and t not in subs}
    assert not unknown, f'topics the node neither publishes nor reads: {sorted(unknown)}'
    assert {f'/{NODE_NAME}/{name}' for name in SHOWN} | {launch_image_topic()} <= named
    three_d = next(v for k, v in panels.items() if k.startswith('3D!'))
    assert three_d['topics']['/lingbot_map/map']['colorMode'] == 'rgb'
    assert three_d['topics']['/lingbot_map/map_pose']['showCovariance'] is True
    assert three_d['followTf'] == 'map'
    # Every panel in the layout tree is configured, and every configured panel is shown.
    assert set(_leaves(layout['layout'])) == set(panels)


def _leaves(node):
    return [node] if isinstance(node, str) else _leaves(node['first']) + _leaves(node['second'])
