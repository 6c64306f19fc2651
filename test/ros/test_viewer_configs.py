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
"""The RViz config and the Foxglove layout show the topics the node publishes.

Run: ``pytest test/ros/test_viewer_configs.py`` (instant; no ROS graph).
"""

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
NODE_TOPICS = {'/lingbot_map/map', '/lingbot_map/path', '/lingbot_map/pose',
               '/lingbot_map/depth'}


def test_rviz_config_has_the_map_path_pose_tf_and_depth():
    config = yaml.safe_load((ROOT / 'rviz' / 'lingbot_map.rviz').read_text())
    manager = config['Visualization Manager']
    assert manager['Global Options']['Fixed Frame'] == 'map'
    displays = {d['Name']: d for d in manager['Displays']}
    topics = {d['Topic']['Value'] for d in displays.values() if 'Topic' in d}
    assert NODE_TOPICS <= topics
    assert displays['TF']['Class'] == 'rviz_default_plugins/TF'
    # ~/map is transient local: a volatile RViz subscription would miss the latched map.
    assert displays['Map']['Topic']['Durability Policy'] == 'Transient Local'
    assert displays['Map']['Color Transformer'] == 'RGB8'


def test_foxglove_layout_panels_refer_to_node_topics():
    layout = json.loads((ROOT / 'foxglove' / 'lingbot_map.json').read_text())
    panels = layout['configById']
    three_d = next(v for k, v in panels.items() if k.startswith('3D!'))
    assert {'/lingbot_map/map', '/lingbot_map/path', '/lingbot_map/pose'} <= \
        set(three_d['topics'])
    assert three_d['topics']['/lingbot_map/map']['colorMode'] == 'rgb'
    image = next(v for k, v in panels.items() if k.startswith('Image!'))
    assert image['imageMode']['imageTopic'] == '/lingbot_map/depth'
    # Every panel in the layout tree is configured.
    assert set(_leaves(layout['layout'])) == set(panels)


def _leaves(node):
    return [node] if isinstance(node, str) else _leaves(node['first']) + _leaves(node['second'])
