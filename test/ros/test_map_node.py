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
"""``~/map`` and ``~/save`` of lingbot_map_node on a real rclpy graph (tiny engine, CPU, depth on).

Run: ``pytest test/ros/test_map_node.py`` (10-20 s on 2 cores; marker ``rostest``).

A subscriber that joins after the map was built still gets it (transient local), and the map it
gets is the accumulator's; ``~/save`` writes the published poses, the map and the intrinsics, and
answers ``success=False`` when the output directory cannot be written; a reset empties the map.
"""

import itertools

from lingbot_map_ros.engine.map.ply import read_ply
from lingbot_map_ros.ros.publishers.map_output import MAP_QOS
from node_harness import image_msg, make_image, stamp_ns, TINY_CPU, wait_for
import numpy as np
import pytest
from rclpy.node import Node
from sensor_msgs.msg import PointCloud2
from std_srvs.srv import Trigger
import yaml

pytestmark = pytest.mark.rostest

_TIMEOUT_S = 60.0
_SEC = 1_000_000_000
_ns = itertools.count()
_NUM_FRAMES = 6


def start(graph, out_dir):
    values = {**TINY_CPU, 'input.queue_mode': 'bag', 'input.qos.reliability': 'reliable',
              'input.qos.depth': 100, 'stream.enable_depth': True, 'map.period_s': 0.1,
              'map.voxel_size': 0.001, 'output.directory': str(out_dir)}
    return graph.start_node(f'/map{next(_ns)}', values)


def late_map(graph, namespace, accept, what):
    """Subscribe to ~/map now and return the first latched map that ``accept`` takes.

    The node marks its map published before the publish call ends, so a subscriber that joins
    in between is handed the map before and gets the one awaited right after.
    """
    listener = graph.add(Node(f'late_{next(_ns)}', namespace=namespace, context=graph.context))
    received = []
    listener.create_subscription(PointCloud2, 'lingbot_map/map', received.append, MAP_QOS)
    msg = wait_for(lambda: next((m for m in received if accept(m)), None), _TIMEOUT_S,
                   f'a latched ~/map: {what}')
    graph.remove(listener)
    return msg


def cloud_xyz(msg):
    record = np.frombuffer(bytes(msg.data), dtype=[('x', '<f4'), ('y', '<f4'), ('z', '<f4'),
                                                   ('rgb', '<u4')])
    return np.stack([record['x'], record['y'], record['z']], axis=1)


def rows(a):
    a = np.asarray(a, np.float64)
    return a[np.lexsort(a.T[::-1])]


def test_late_subscriber_gets_the_map_and_save_writes_it(graph, tmp_path):
    node, probe = start(graph, tmp_path / 'saves')
    sent = [int((20.0 + 0.1 * i) * _SEC) for i in range(_NUM_FRAMES)]
    for i, t in enumerate(sent):
        probe.image_pub.publish(image_msg(make_image(i), t))
    wait_for(lambda: probe.count(probe.poses) >= _NUM_FRAMES, _TIMEOUT_S, 'poses')
    map_output = node.core.pipeline.map_output
    accumulator = map_output.accumulator
    wait_for(lambda: accumulator.num_keyframes == _NUM_FRAMES, _TIMEOUT_S, 'keyframes in map')
    xyz, _ = accumulator.points()
    assert len(xyz) > 100
    wait_for(lambda: map_output.published_stamp_ns == sent[-1], _TIMEOUT_S,
             'the map with the last keyframe published')

    msg = late_map(graph, node.get_namespace(), lambda m: stamp_ns(m) == sent[-1],
                   "the last keyframe's")
    assert msg.header.frame_id == 'odom' and stamp_ns(msg) == sent[-1]
    assert [f.name for f in msg.fields] == ['x', 'y', 'z', 'rgb']
    assert msg.width == len(xyz) and msg.point_step == 16
    np.testing.assert_allclose(rows(cloud_xyz(msg)), rows(xyz))

    save = probe.create_client(Trigger, 'lingbot_map/save')
    reply = probe.call(save, Trigger.Request())
    assert reply.success, reply.message
    folder = tmp_path / 'saves' / reply.message.rsplit('/', 1)[-1]
    assert reply.message == str(folder) and folder.is_dir()
    tum = [line.split() for line in (folder / 'trajectory.tum').read_text().splitlines()
           if not line.startswith('#')]
    assert [round(float(r[0]) * _SEC) for r in tum] == sent
    last = probe.poses[-1].pose.position
    np.testing.assert_allclose([float(v) for v in tum[-1][1:4]], [last.x, last.y, last.z],
                               rtol=1e-6, atol=1e-9)
    ply_xyz, _ = read_ply(folder / 'map.ply')
    np.testing.assert_allclose(rows(ply_xyz), rows(xyz))
    info = yaml.safe_load((folder / 'camera_info.yaml').read_text())
    assert (info['image_width'], info['image_height']) == (80, 60)
    k = np.array(info['camera_matrix']['data']).reshape(3, 3)
    # A centred principal point (within the crop's rounding).
    assert k[0, 0] > 0 and abs(k[0, 2] - 40.0) < 0.5 and abs(k[1, 2] - 30.0) < 0.5
    processed = yaml.safe_load((folder / 'camera_info_processed.yaml').read_text())
    assert processed['image_width'] == TINY_CPU['stream.image_width']

    # A second save in the same second gets its own folder.
    again = probe.call(save, Trigger.Request())
    assert again.success and again.message != reply.message

    # A directory that cannot be created (its parent is a file): a clear failure, no crash.
    blocker = tmp_path / 'not_a_dir'
    blocker.write_text('x')
    assert probe.set_params(output__directory=str(blocker / 'saves'))[0].successful
    failed = probe.call(save, Trigger.Request())
    assert not failed.success
    assert 'failed' in failed.message and str(blocker) in failed.message

    # A reset starts a new map: the latched map is empty.
    assert probe.call(probe.reset_client, Trigger.Request()).success
    wait_for(lambda: accumulator.num_points == 0 and map_output.published_stamp_ns is not None,
             _TIMEOUT_S, 'the empty map published')
    empty = late_map(graph, node.get_namespace(), lambda m: m.width == 0, 'empty')
    assert empty.header.frame_id == 'odom' and not empty.data
    graph.remove(node)
