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
"""lingbot_map_node levels ``odom`` or ``map`` with the IMU's gravity (real rclpy, CPU, oracle).

The synthetic route (the camera looks down and turns) with the camera mounted on the base with a
roll and a pitch (``frames.base_to_camera``) and the IMU turned on the camera
(``imu.imu_from_camera``); the oracle network answers each session in a random world of its own.

- **Still at the anchor:** a second of still readings at the first pose before the first image:
  the first ``~/odometry`` pose's roll and pitch are the base's true ones, and odom's z agrees
  with true gravity along the route, across rollovers; after ``~/reset`` (the robot still
  again) it levels again.
- **Moving from the start:** odom is anchored as without an IMU (the first pose is the
  identity); once the alignment gives gravity, ``map`` is levelled (``~/map_pose`` with loop
  closure on, the ``imu`` status) while ``~/odometry`` has no step beyond the motion.

The node without an IMU and with a silent one is ``test_imu_node.py``'s.
Run: ``pytest test/ros/test_imu_gravity_node.py`` (a minute or two on 2 busy cores; marker
``rostest``).
"""

import itertools
import math
from pathlib import Path
import sys
import threading

from geometry_msgs.msg import PoseWithCovarianceStamped
from lingbot_map_ros.engine.imu import so3
from lingbot_map_ros.engine.mapping.store.map_load import load_map
from lingbot_map_ros.tools.synthetic_imu import (DEFAULT_IMU_FROM_CAMERA, frame_poses,
                                                 imu_readings, ImuNoise, synthetic_imu)
from lingbot_map_ros.tools.synthetic_scene import camera_path
from node_harness import (image_msg, no_callback_errors, stamp_ns,  # noqa: F401
                          TINY_CPU, wait_for, wait_status)
import numpy as np
import pytest
from rclpy.qos import qos_profile_sensor_data, QoSProfile, ReliabilityPolicy
from scipy.spatial.transform import Rotation
from sensor_msgs.msg import Imu
from std_srvs.srv import Trigger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
from oracle_model import frame_image, OracleModel  # noqa: E402,I100,I202

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine' / 'loop'))
from loop_scenes import RefuseAll  # noqa: E402,I100,I202
from test_imu_node import (_TIMEOUT_S, ENGINE, imu_msg, mount7, SCENE,  # noqa: E402,I100,I202
                           SEC, SIZE_HW)

pytestmark = pytest.mark.rostest

_ns = itertools.count()
DOWN = np.array([0.0, 0.0, -1.0])
ROOM = camera_path(SCENE.num_frames, SCENE.laps)  # camera in the z-up room, per frame


def _mounts() -> tuple[np.ndarray, np.ndarray]:
    """Return (camera body in base: rolled and pitched, imu_from_camera: turned)."""
    base_from_body = np.eye(4)
    base_from_body[:3, :3] = so3.exp(np.array([0.15, -0.3, 0.2]))
    base_from_body[:3, 3] = [0.1, 0.0, 0.4]
    imu_from_camera = DEFAULT_IMU_FROM_CAMERA.copy()
    imu_from_camera[:3, :3] = so3.exp(np.array([0.25, -0.1, 0.3])) @ imu_from_camera[:3, :3]
    return base_from_body, imu_from_camera


BASE_FROM_BODY, IMU_FROM_CAMERA = _mounts()
OPTICAL_IN_BODY = np.array([[0.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0],
                            [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
MOUNT = BASE_FROM_BODY @ OPTICAL_IN_BODY  # B: the optical frame in base


def true_base(index: int) -> np.ndarray:
    """Return base's true orientation in the z-up room at frame ``index``."""
    return (ROOM[index] @ np.linalg.inv(MOUNT))[:3, :3]


def roll_pitch_deg(rotation: np.ndarray) -> np.ndarray:
    """Return (roll, pitch) in degrees of a z-up frame's orientation (REP 103 yaw-pitch-roll)."""
    yaw_pitch_roll = Rotation.from_matrix(rotation).as_euler('ZYX', degrees=True)
    return np.array([yaw_pitch_roll[2], yaw_pitch_roll[1]])


def angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return math.degrees(so3.angle_between(a, b))


def turn_deg(rotation: np.ndarray) -> float:
    return math.degrees(float(np.linalg.norm(so3.log(rotation))))


def orientation(msg) -> np.ndarray:
    q = msg.pose.pose.orientation
    return Rotation.from_quat([q.x, q.y, q.z, q.w]).as_matrix()


def still_readings(index: int, start_ns: int, end_ns: int, seed: int):
    """Return (stamps, gyro, accel): the IMU standing still at frame ``index``'s pose.

    200 Hz from ``start_ns`` to ``end_ns`` inclusive, the synthetic IMU's noise and biases.
    """
    stamps = np.arange(start_ns, end_ns + 1, 5_000_000, dtype=np.int64)
    room_from_imu = ROOM[index] @ np.linalg.inv(IMU_FROM_CAMERA)
    dense = np.repeat(room_from_imu[None], 4 * len(stamps) + 1, axis=0)
    gyro, accel, _, _ = imu_readings(dense, 0.005, ImuNoise(), seed)
    return stamps, gyro, accel


class Run:
    """A node on the oracle, its probe, the IMU publisher, the ~/odometry and ~/map_pose."""

    def __init__(self, graph, **overrides) -> None:
        """Start the node in bag mode with the tilted mountings."""
        values = {**TINY_CPU, 'input.queue_mode': 'bag', 'input.qos.reliability': 'reliable',
                  'input.qos.depth': 100, **ENGINE, 'input.imu_topic': 'imu',
                  'imu.imu_from_camera': mount7(IMU_FROM_CAMERA),
                  'frames.base_to_camera': mount7(BASE_FROM_BODY), **overrides}
        self.graph = graph
        self.node, self.probe = graph.start_node(f'/grav{next(_ns)}', values)
        session = self.node.core.pipeline.session.session
        self.oracle = OracleModel(frame_poses(SCENE), session.config, noise=0.0005, seed=6)
        session.replace_stream(self.oracle)
        self.fusion = self.node.core.pipeline.imu
        self.imu = synthetic_imu(SCENE, seed=3, imu_from_camera=IMU_FROM_CAMERA)
        self.pub = self.probe.create_publisher(Imu, 'imu', qos_profile_sensor_data)
        sub = next(s for s in self.node.subscriptions if s.topic_name.endswith('/imu'))
        wait_for(lambda: sub.get_publisher_count() > 0, _TIMEOUT_S, 'imu matching')
        self.lock = threading.Lock()
        self.map_poses: list = []
        self.probe.create_subscription(
            PoseWithCovarianceStamped, 'lingbot_map/map_pose', self._map_pose,
            QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
        self.sent_imu = 0

    def _map_pose(self, msg) -> None:
        with self.lock:
            self.map_poses.append(msg)

    def send_imu(self, stamps, gyro, accel, chunk: int = 5) -> None:
        """Publish readings a few at a time (the subscription keeps a short history)."""
        for lo in range(0, len(stamps), chunk):
            for k in range(lo, min(lo + chunk, len(stamps))):
                self.pub.publish(imu_msg(stamps[k], gyro[k], accel[k]))
            self.sent_imu += min(lo + chunk, len(stamps)) - lo
            wait_for(lambda: self.fusion.input.received >= self.sent_imu, _TIMEOUT_S,
                     f'{self.sent_imu} IMU readings received')

    def feed(self, indices, after_ns: int = -1) -> None:
        """Publish frames ``indices``, each after the route's readings up to its stamp."""
        imu, done = self.imu, len(self.probe.odometry)
        for i in indices:
            t = SCENE.start_ns + i * SEC // 10
            lo = int(np.searchsorted(imu.stamps_ns, after_ns, side='right'))
            hi = int(np.searchsorted(imu.stamps_ns, t, side='right'))
            if hi > lo:
                self.send_imu(imu.stamps_ns[lo:hi], imu.gyro[lo:hi], imu.accel[lo:hi])
            after_ns = max(after_ns, t)
            self.probe.image_pub.publish(image_msg(frame_image(i, SIZE_HW), t))
        wait_for(lambda: self.probe.count(self.probe.odometry) >= done + len(indices),
                 _TIMEOUT_S, f'{done + len(indices)} odometry messages')

    def odometry(self) -> list:
        with self.probe.lock:
            return list(self.probe.odometry)

    def status(self, predicate, what: str) -> dict:
        return wait_status(self.probe, self.node, 'imu', lambda lvl, m, v: predicate(v), what,
                           _TIMEOUT_S)[2]

    def close(self) -> None:
        self.graph.remove(self.node)


def check_levelled(odometry: list, indices: list, first_tilt_deg: float) -> None:
    """Check the first pose's roll and pitch and odom's z along the run against the truth."""
    first = orientation(odometry[0])
    truth = true_base(indices[0])
    print(f'first pose roll/pitch {roll_pitch_deg(first)} deg, truth '
          f'{roll_pitch_deg(truth)} deg')
    np.testing.assert_allclose(roll_pitch_deg(first), roll_pitch_deg(truth), atol=1.0)
    position = odometry[0].pose.pose.position
    assert abs(position.x) + abs(position.y) + abs(position.z) < 1e-9  # odom's origin
    assert angle_deg(truth.T @ DOWN, DOWN) > 10.0  # a tilt worth levelling
    assert first_tilt_deg == pytest.approx(angle_deg(first.T @ DOWN, DOWN), abs=1e-3)
    worst = max(angle_deg(orientation(msg).T @ DOWN, true_base(i).T @ DOWN)
                for msg, i in zip(odometry, indices))
    print(f'odom z against true gravity: worst {worst:.3f} deg over {len(indices)} poses')
    assert worst < 1.0


def test_still_start_levels_odom_and_a_reset_levels_it_again(graph):
    # Sessions of 20 keyframes: the levelling must hold across rollovers.
    run = Run(graph, **{'stream.session_keyframes': 20})
    t0 = SCENE.start_ns
    run.send_imu(*still_readings(0, t0 - SEC, t0, seed=11))
    first = list(range(50))
    run.feed(first, after_ns=t0)
    values = run.status(lambda v: v.get('gravity.frame') == 'odom', 'odom levelled')
    assert run.node.core.pipeline.session.rollover_stats().rollovers >= 2
    odometry = run.odometry()
    assert [stamp_ns(m) for m in odometry] == [t0 + i * SEC // 10 for i in first]
    check_levelled(odometry, first, float(values['gravity.tilt_deg']))
    # ~/reset while the robot stands still at frame 53's pose (0.4 s after the last frame:
    # readings further past the newest image are dropped as future): odom levels again there.
    response = run.probe.call(run.probe.reset_client, Trigger.Request())
    assert response.success
    t49, t53 = t0 + 49 * SEC // 10, t0 + 53 * SEC // 10
    run.send_imu(*still_readings(53, t49 + 5_000_000, t53, seed=12))
    second = list(range(53, 75))
    run.feed(second, after_ns=t53)
    again = run.odometry()[len(first):]
    values = run.status(lambda v: v.get('gravity.frame') == 'odom', 'odom levelled again')
    check_levelled(again, second, float(values['gravity.tilt_deg']))
    run.close()


def test_moving_start_levels_map_and_odometry_stays_continuous(graph, tmp_path):
    run = Run(graph, **{'loop.enable': True, 'loop.image_store_mb': 0.0,
                        'loop.exclude_recent': 1000, 'loop.min_score': 0.99})
    # The loop closer runs (the graph only grows): no candidate is ever verified.
    feed = run.node.core.pipeline.loop_output.feed
    feed.use_verifier(RefuseAll())
    rng = np.random.default_rng(5)
    dims = run.node.core.pipeline.session.session.config.model.embed_dim  # a map keeps them
    feed.descriptor_of = lambda pred: rng.normal(size=dims).astype(np.float32)
    indices = list(range(90))
    early = 10  # a second of motion: too short for the alignment, gravity not known yet
    run.feed(indices[:early])
    values = run.status(lambda v: int(v.get('stream.received', '0')) > 150, 'IMU heard')
    assert values['gravity.frame'] == 'none' and values['gravity.tilt_deg'] == 'n/a'
    run.feed(indices[early:], after_ns=SCENE.start_ns + (early - 1) * SEC // 10)
    values = run.status(lambda v: v.get('gravity.frame') == 'map', 'map levelled')
    odometry = run.odometry()
    # odom is anchored as without an IMU: the first pose is the identity.
    np.testing.assert_allclose(orientation(odometry[0]), np.eye(3), atol=1e-12)
    # map -> odom carries the tilt: base in map sees true gravity. The levelling is fixed
    # once; ~/map_pose is published from the frame after it on.
    frames = run.node.core.pipeline.outputs.frames
    level = frames.map_level()[:3, :3]
    tilt = float(values['gravity.tilt_deg'])
    assert tilt == pytest.approx(angle_deg(level.T @ DOWN, DOWN), abs=1e-3)
    assert tilt == pytest.approx(angle_deg(true_base(0).T @ DOWN, DOWN), abs=1.0)
    worst = max(angle_deg((level @ orientation(m)).T @ DOWN, true_base(i).T @ DOWN)
                for m, i in zip(odometry, indices))
    print(f'map z against true gravity: worst {worst:.3f} deg, tilt {tilt:.2f} deg')
    assert worst < 1.0
    # The loop closer's map -> odom is that levelling times the graph's own correction (no loop
    # here: only the odometry and the gyroscope's factors), a small turn beside the tilt.
    loop_map = run.node.core.pipeline.loop_output.map_from_odom()
    assert turn_deg(level.T @ loop_map[:3, :3]) < 1.0
    stamp_of = {stamp_ns(m): i for m, i in zip(odometry, indices)}
    with run.lock:
        map_poses = list(run.map_poses)
    last = map_poses[-1]
    i = stamp_of[stamp_ns(last)]
    assert angle_deg(orientation(last).T @ DOWN, true_base(i).T @ DOWN) < 1.0
    # ~/odometry never jumps: each rotation step is the true one within a fraction of a degree.
    steps = [turn_deg(orientation(a).T @ orientation(b)) - turn_deg(true_base(i).T @ true_base(j))
             for a, b, i, j in zip(odometry, odometry[1:], indices, indices[1:])]
    print(f'odometry rotation steps against the truth: worst {max(map(abs, steps)):.3f} deg')
    assert max(abs(s) for s in steps) < 0.3
    # A map saved now is in this levelled map: its frame is odom's anchor turned by the
    # levelling, so a later run that loads it publishes z-up too.
    assert run.probe.set_params(map__save_path=str(tmp_path / 'map'))[0].successful
    saved = run.probe.call(run.probe.create_client(Trigger, 'lingbot_map/save_map'),
                           Trigger.Request(), _TIMEOUT_S)
    assert saved.success, saved.message
    frame = load_map(tmp_path / 'map').frame_from_graph
    expected = frames.map_level() @ frames.odom_from_world()
    np.testing.assert_allclose(frame, expected, atol=1e-9)
    run.close()
