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
"""lingbot_map_node with ``input.imu_topic`` on a real rclpy graph (CPU, oracle network).

The oracle network (test/engine/oracle_model.py) answers the session with the synthetic route's
ground truth in an unknown scale; the route's 200 Hz IMU (tools/synthetic_imu.py: noise, biases,
the default mounting) is published on ``imu`` beside the images. The node must lock the
session's scale within 2 % of the truth, publish metric poses from then on and the ``imu``
status (with the mounting read from a /tf_static buffer); hostile IMU messages end as counted
drops, never a crash; an IMU that never starts is one WARN on /rosout while every pose is
published; with the IMU topic unset, or set but silent, the poses are those of the colour-only
node.

Run: ``pytest test/ros/test_imu_node.py`` (about a minute on 2 busy cores; marker ``rostest``).
"""

import itertools
import math
from pathlib import Path
import sys

from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import TransformStamped

from lingbot_map_ros.ros.publishers.imu_status import IMU_KEYS
from lingbot_map_ros.tools.synthetic_imu import DEFAULT_FRAME_ID, frame_poses, synthetic_imu
from lingbot_map_ros.tools.synthetic_scene import SceneConfig
from node_harness import (image_msg, no_callback_errors, Rosout, stamp_ns,  # noqa: F401
                          TINY_CPU, wait_for, wait_status)
import numpy as np
import pytest
from rcl_interfaces.msg import Log
from rclpy.qos import qos_profile_sensor_data
from scipy.spatial.transform import Rotation
from sensor_msgs.msg import Imu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
from oracle_model import frame_image, OracleModel  # noqa: E402,I100,I202

pytestmark = pytest.mark.rostest

_ns = itertools.count()
_TIMEOUT_S = 120.0
SEC = 1_000_000_000
SIZE_HW = (48, 64)
SCENE = SceneConfig(laps=2, start_ns=50 * SEC)
ENGINE = {'model.max_frame_num': 128, 'stream.session_keyframes': 100,
          'stream.overlap_keyframes': 8}


def mount7(matrix: np.ndarray) -> list[float]:
    """Return a [4, 4] mounting as x y z qx qy qz qw."""
    quat = Rotation.from_matrix(matrix[:3, :3]).as_quat()
    return [*map(float, matrix[:3, 3]), *map(float, quat)]


def imu_msg(stamp: int, gyro, accel, frame_id: str = DEFAULT_FRAME_ID) -> Imu:
    """Build a sensor_msgs/Imu of one reading (no orientation)."""
    msg = Imu()
    msg.header.frame_id = frame_id
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp), SEC)
    msg.orientation_covariance[0] = -1.0
    msg.angular_velocity.x, msg.angular_velocity.y, msg.angular_velocity.z = map(float, gyro)
    msg.linear_acceleration.x, msg.linear_acceleration.y, msg.linear_acceleration.z = \
        map(float, accel)
    return msg


def start(graph, imu_topic: str, ns: str | None = None, **overrides):
    """Start a node in bag mode with the oracle on the route; return it, its probe, the oracle."""
    imu = synthetic_imu(SCENE, seed=3)
    values = {**TINY_CPU, 'input.queue_mode': 'bag', 'input.qos.reliability': 'reliable',
              'input.qos.depth': 100, **ENGINE, 'input.imu_topic': imu_topic,
              'imu.imu_from_camera': mount7(imu.imu_from_camera), **overrides}
    node, probe = graph.start_node(ns or f'/imu{next(_ns)}', values)
    session = node.core.pipeline.session.session
    oracle = OracleModel(frame_poses(SCENE), session.config, noise=0.0005, seed=6)
    session.replace_stream(oracle)
    return node, probe, oracle, imu


def frame_stamps(num: int) -> list[int]:
    """Return the route's first ``num`` frame stamps (ns)."""
    return [SCENE.start_ns + i * SEC // 10 for i in range(num)]


def feed(node, probe, imu, num: int, imu_pub=None, chunk: int = 5) -> list[int]:
    """Publish ``num`` frames, each after the IMU readings up to its stamp (if ``imu_pub``).

    The readings go a few at a time: the subscription keeps a short best-effort history.
    """
    fusion = node.core.pipeline.imu
    sent, published = frame_stamps(num), 0
    for i, t in enumerate(sent):
        if imu_pub is not None:
            stop = int(np.searchsorted(imu.stamps_ns, t, side='right'))
            while published < stop:
                end = min(published + chunk, stop)
                for k in range(published, end):
                    imu_pub.publish(imu_msg(imu.stamps_ns[k], imu.gyro[k], imu.accel[k]))
                published = end
                wait_for(lambda: fusion.input.received >= published, _TIMEOUT_S,
                         f'{published} IMU readings received')
        probe.image_pub.publish(image_msg(frame_image(i, SIZE_HW), t))
    wait_for(lambda: probe.count(probe.poses) >= num, _TIMEOUT_S, f'{num} poses')
    assert [stamp_ns(p) for p in probe.poses] == sent
    return sent


def positions(poses) -> np.ndarray:
    return np.array([[p.pose.position.x, p.pose.position.y, p.pose.position.z]
                     for p in poses])


def imu_publisher(probe, node):
    pub = probe.create_publisher(Imu, 'imu', qos_profile_sensor_data)
    sub = next(s for s in node.subscriptions if s.topic_name.endswith('/imu'))
    wait_for(lambda: sub.get_publisher_count() > 0, _TIMEOUT_S, 'imu matching')
    return pub


class StaticBuffer:
    """A tf2 buffer holding fixed transforms (tf2_ros is not part of the PyPI wheels)."""

    def __init__(self, *transforms: TransformStamped) -> None:
        self.transforms = {(t.header.frame_id, t.child_frame_id): t for t in transforms}

    def lookup_transform(self, target: str, source: str, _time) -> TransformStamped:
        if (target, source) not in self.transforms:
            raise LookupError(f'{target} -> {source} unknown')
        return self.transforms[(target, source)]


def static_mount(parent: str, child: str, matrix: np.ndarray) -> TransformStamped:
    """Return the /tf_static transform ``parent -> child`` of a [4, 4] mounting."""
    tf = TransformStamped(child_frame_id=child)
    tf.header.frame_id = parent
    t, q = tf.transform.translation, tf.transform.rotation
    t.x, t.y, t.z, q.x, q.y, q.z, q.w = mount7(matrix)
    return tf


def test_the_imu_locks_the_scale_and_the_poses_become_metric(graph):
    # The mounting comes from /tf_static only: the parameter (the identity) is wrong, and with
    # it the gyroscope's rotations would not match the camera's and the scale would not lock.
    truth = synthetic_imu(SCENE, seed=3).imu_from_camera
    node, probe, oracle, imu = start(graph, 'imu', **{'imu.imu_from_camera': mount7(np.eye(4))})
    fusion = node.core.pipeline.imu
    fusion.mounting.use_tf_buffer(StaticBuffer(
        static_mount(DEFAULT_FRAME_ID, 'cam_optical', truth)))  # what tf2_ros would hand over
    pub = imu_publisher(probe, node)
    num = 90
    feed(node, probe, imu, num, pub)
    _, message, values = wait_status(probe, node, 'imu',
                                     lambda lvl, m, v: v.get('scale.state') == 'locked',
                                     'the IMU scale locked', _TIMEOUT_S)
    assert list(values) == list(IMU_KEYS)
    assert values['topic'] == 'imu' and values['frame_id'] == DEFAULT_FRAME_ID
    assert values['stream.state'] == 'ok'
    assert float(values['stream.rate_hz']) == pytest.approx(200.0, rel=0.02)
    assert all(values[f'stream.drops.{r}'] == '0'
               for r in ('non_finite', 'out_of_order', 'future', 'wrong_frame'))
    assert values['depth.scale'] == 'n/a'
    assert values['mounting'] == 'tf' and values['stream.pauses'] == '0'
    np.testing.assert_allclose(fusion.imu_from_camera, truth, atol=1e-9)
    # One session (no rollover in 90 frames): its truth is the oracle's factor's inverse.
    assert len({s[0] for s in oracle.sessions}) == 1
    truth = 1.0 / oracle.sessions[0][0]
    print(f"IMU scale {values['scale.scale']} m/unit, truth {truth:.6g}: "
          f"{100 * (float(values['scale.scale']) / truth - 1):+.2f} %")
    assert float(values['scale.scale']) == pytest.approx(truth, rel=0.02)
    assert 'locked' in message
    gravity = np.array([float(v) for v in values['gravity'].split()])
    assert np.linalg.norm(gravity) == pytest.approx(1.0, abs=1e-3)
    # The last 20 poses were published with the locked scale: their steps are metres.
    gt = frame_poses(SCENE)[:num, :3, 3]
    published = positions(probe.poses)
    steps = np.linalg.norm(np.diff(published[-20:], axis=0), axis=1)
    np.testing.assert_allclose(steps, np.linalg.norm(np.diff(gt[-20:], axis=0), axis=1),
                               rtol=0.03, atol=0.002)
    graph.remove(node)


def test_hostile_imu_messages_are_counted_and_the_colour_path_goes_on(graph):
    node, probe, _, imu = start(graph, 'imu')
    pub = imu_publisher(probe, node)
    fusion = node.core.pipeline.imu
    t0 = SCENE.start_ns
    hostile = [imu_msg(t0 + 1000, [math.nan, 0.0, 0.0], [0.0, 0.0, 9.81]),  # non_finite
               imu_msg(t0 + 2000, [0.0, 0.0, 0.0], [math.inf, 0.0, 9.81]),  # non_finite
               imu_msg(t0 + 3000, [0.0, 0.0, 0.0], [0.0, 0.0, 9.81]),  # kept (frame taken)
               imu_msg(t0 + 3000, [0.0, 0.0, 0.0], [0.0, 0.0, 9.81]),  # out_of_order
               imu_msg(t0 + 4000, [0.0, 0.0, 0.0], [0.0, 0.0, 9.81], 'other'),  # wrong_frame
               imu_msg(0, [0.0, 0.0, 0.0], [0.0, 0.0, 9.81]),  # bad_message (zero stamp)
               imu_msg(t0 + 5000, [40.0, 0.0, 0.0], [0.0, 0.0, 9.81])]  # saturated
    for k, msg in enumerate(hostile):
        pub.publish(msg)
        wait_for(lambda: fusion.input.received >= k + 1, _TIMEOUT_S, f'IMU message {k}')
    feed(node, probe, imu, 12)
    _, _, values = wait_status(
        probe, node, 'imu', lambda lvl, m, v: v.get('stream.received') == str(len(hostile)),
        'the hostile messages counted', _TIMEOUT_S)
    assert (values['stream.drops.non_finite'], values['stream.drops.out_of_order'],
            values['stream.drops.wrong_frame'], values['stream.drops.bad_message'],
            values['stream.drops.saturated']) == ('2', '1', '1', '1', '1')
    assert values['stream.accepted'] == '1'
    assert values['scale.state'] == 'waiting' and values['scale.scale'] == 'n/a'
    graph.remove(node)


def test_poses_without_an_imu_and_with_a_silent_one_are_identical(graph):
    runs = []
    for topic in ('', 'imu'):
        node, probe, _, imu = start(graph, topic)
        assert (node.core.pipeline.imu is None) == (topic == '')
        feed(node, probe, imu, 30)
        runs.append(positions(probe.poses))
        graph.remove(node)
    np.testing.assert_allclose(runs[1], runs[0], rtol=0, atol=1e-9)


def test_an_imu_that_never_starts_warns_once_and_the_poses_go_on(graph):
    """input.imu_topic set, no publisher: one WARN on /rosout, a pause counted, every pose."""
    ns = f'/imu{next(_ns)}'
    rosout = Rosout(graph, f'{ns.strip("/")}.lingbot_map')
    node, probe, _, imu = start(graph, 'imu', ns=ns)
    start_line = wait_for(lambda: rosout.find(Log.INFO, "IMU on 'imu'"), _TIMEOUT_S,
                          'the start line')
    assert 'from imu.imu_from_camera' in start_line[0]
    feed(node, probe, imu, 40)  # 4 s of frames, four times the silence span
    level, message, values = wait_status(
        probe, node, 'imu', lambda lvl, m, v: v.get('stream.state') == 'silent', 'silent',
        _TIMEOUT_S)
    assert values['stream.pauses'] == '1' and values['stream.received'] == '0'
    assert level == DiagnosticStatus.WARN and 'silent' in message
    warned = wait_for(lambda: rosout.find(Log.WARN, 'IMU silent'), _TIMEOUT_S, 'the WARN')
    assert len(warned) == 1, warned
    assert 'not started' in warned[0] and 'paused' in warned[0]
    assert values['scale.state'] == 'waiting' and values['mounting'] == 'parameter'
    graph.remove(node)
