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
"""One camera is a group of one: the plain node and a one-entry ``input.cameras`` node agree.

Both run the same frames (same images, stamps and frame id, same seed of the random tiny model)
on the real rclpy graph, in bag mode. The plain node's ``~/pose`` and the one-entry node's fused
``~/pose`` and its ``~/front/pose`` carry the same poses, since a group of one camera is fed and
aligned exactly as the camera alone (the primary's alignment is the identity).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from geometry_msgs.msg import PoseStamped
from node_harness import bag, image_msg, make_image, publish, stamp_ns, stamps, TINY_CPU
from node_harness import no_callback_errors  # noqa: F401 - the autouse check, here too
from node_harness import wait_for, wait_poses
import numpy as np
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image

_ns = itertools.count()
_TIMEOUT_S = 120.0
_NUM = 8
BAG = {**TINY_CPU, **{k.replace('__', '.'): v for k, v in bag().items()}}


class FrontProbe(Node):
    """Publishes camera ``front``'s images; records ``~/pose`` and ``~/front/pose``."""

    def __init__(self, context: Any, namespace: str) -> None:
        """Create the image publisher and the two pose subscriptions."""
        super().__init__(f'front_probe_{next(_ns)}', namespace=namespace, context=context)
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.lock = threading.Lock()
        self.pub = self.create_publisher(Image, 'front/image', qos)
        self.poses: dict[str, list[PoseStamped]] = {'pose': [], 'front/pose': []}
        for topic, store in self.poses.items():
            self.create_subscription(PoseStamped, f'lingbot_map/{topic}',
                                     lambda msg, s=store: self._keep(s, msg), qos)

    def _keep(self, store: list, msg: Any) -> None:
        with self.lock:
            store.append(msg)

    def taken(self, topic: str) -> list[PoseStamped]:
        """Return the poses received on ``topic`` so far."""
        with self.lock:
            return list(self.poses[topic])


def _array(poses: list[PoseStamped]) -> np.ndarray:
    return np.array([[p.pose.position.x, p.pose.position.y, p.pose.position.z,
                      p.pose.orientation.x, p.pose.orientation.y, p.pose.orientation.z,
                      p.pose.orientation.w] for p in poses])


def _frames() -> list[Image]:
    return [image_msg(make_image(i), t) for i, t in enumerate(stamps(30.0, _NUM))]


def test_one_camera_and_a_one_entry_camera_group_give_the_same_poses(graph):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    node, probe = graph.start_node(f'/solo{next(_ns)}', BAG)
    publish(probe, _frames())
    wait_poses(probe, _NUM)
    with probe.lock:
        plain = list(probe.poses)
    graph.remove(probe)
    graph.remove(node)

    namespace = f'/one{next(_ns)}'
    group_node = graph.add(LingbotMapNode(
        context=graph.context, namespace=namespace,
        parameter_overrides=[Parameter(k, value=v) for k, v in
                             {**BAG, 'input.cameras': ['front']}.items()]))
    front = graph.add(FrontProbe(graph.context, namespace))
    wait_for(lambda: front.pub.get_subscription_count() > 0 and
             all(s.get_publisher_count() > 0 for s in group_node.subscriptions
                 if s.topic_name.endswith('/image')), 30.0, 'matching')
    for msg in _frames():
        front.pub.publish(msg)
    for topic in ('pose', 'front/pose'):
        wait_for(lambda t=topic: len(front.taken(t)) >= _NUM, _TIMEOUT_S, f'{topic} poses')
    sent = stamps(30.0, _NUM)
    assert [stamp_ns(p) for p in plain] == sent
    assert {p.header.frame_id for p in plain} == {'odom'}
    expected = _array(plain)
    assert np.ptp(expected[:, :3], axis=0).max() > 1e-6  # the poses move: a real comparison
    for topic in ('pose', 'front/pose'):
        poses = front.taken(topic)
        assert [stamp_ns(p) for p in poses] == sent
        assert {p.header.frame_id for p in poses} == {'odom'}
        np.testing.assert_allclose(_array(poses), expected, rtol=0, atol=1e-6)
    graph.remove(front)
    graph.remove(group_node)
