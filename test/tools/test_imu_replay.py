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
"""IMU replay: ``make-bag --synthetic --imu``, ``run --imu-topic``, and the oracle's metric ATE.

Run: ``pytest test/tools/test_imu_replay.py`` (about a minute on 2 cores). The accuracy is
checked with the oracle network (test/engine/oracle_model.py: the poses are the synthetic
route's ground truth in an unknown frame and scale per session, with noise, stitched over
rollovers) on the route's 200 Hz IMU with noise and bias, fused during the run as in the node
(the session's IMU hook), against the RGB-D path on the same frames; the command line runs with
the tiny random-weight model.
"""

import json
from pathlib import Path
import sys

from lingbot_map_ros.config import ImuConfig, MetricConfig
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.bag_io import depth_message
from lingbot_map_ros.tools.offline import OfflineRunner, RunOptions
from lingbot_map_ros.tools.replay import find_config, main
from lingbot_map_ros.tools.replay_imu import _rigid_fit, evaluate, ImuRun
from lingbot_map_ros.tools.synthetic_imu import bag_messages, frame_poses, synthetic_imu
from lingbot_map_ros.tools.synthetic_scene import SceneConfig
from lingbot_map_ros.tools.trajectory import Trajectory
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
from oracle_model import frame_image, oracle_session  # noqa: E402,I100,I202

SEC = 1_000_000_000
SIZE_HW = (48, 64)
SCENE = SceneConfig(laps=3, start_ns=50 * SEC)
SESSION = {'stream.session_keyframes': 80, 'stream.overlap_keyframes': 8}
"""Sessions long enough for the IMU to lock within each (about 6 s of motion), three of them."""

torch.set_num_threads(1)


def plane_m(index: int) -> float:
    """Return the oracle's ground-truth depth of frame ``index`` (a plane), metres."""
    return 2.0 + 0.5 * np.sin(0.05 * index)


def write_route_bag(path: Path) -> None:
    """Oracle frames of the two-lap route with their depth, and the route's IMU."""
    imu = synthetic_imu(SCENE, seed=3)
    with bag_io.BagWriter(path) as bag:
        for i in range(SCENE.total_frames):
            stamp = SCENE.start_ns + i * SEC // 10
            bag.write('/cam/depth', stamp,
                      depth_message(np.full(SIZE_HW, plane_m(i)), stamp, 'cam'))
            bag.write('/cam/image', stamp,
                      bag_io.image_message(frame_image(i, SIZE_HW), stamp, 'cam'))
        for topic, stamp, msg in bag_messages(imu, '/imu'):
            bag.write(topic, stamp, msg)
    return imu


def metric_ate(est: Trajectory, gt: np.ndarray, scale: float = 1.0) -> float:
    """Return the RMS position error after a rigid (no scale) fit, metres."""
    p = scale * est.c2w[:, :3, 3]
    rotation, shift = _rigid_fit(p, gt[:, :3, 3])
    return float(np.sqrt(np.mean(np.sum((gt[:, :3, 3] - p @ rotation.T - shift) ** 2, 1))))


def replay(bag: Path, out: Path, metric: bool, imu: ImuRun | None = None
           ) -> tuple[Trajectory, dict]:
    """Replay the oracle over the route bag: the depth camera's scale, the IMU's, or neither."""
    gt = frame_poses(SCENE)
    session, _ = oracle_session(gt, noise=0.0005, seed=6, **SESSION,
                                **{'stream.enable_depth': metric})
    config = MetricConfig(source='depth', settle_keyframes=6) if metric else MetricConfig()
    options = RunOptions(map_axes='optical', metric=config,
                         depth_topic='/cam/depth' if metric else '', imu=imu)
    runner = OfflineRunner(RolloverSession(session, config), options, out)
    with bag_io.open_bag(bag) as reader:
        topics = ['/cam/image'] + (['/cam/depth'] if metric else []) + \
            ([imu.config.topic] if imu is not None else [])
        summary = runner.run(bag_io.read_raw(reader, topics))
    assert summary['poses'] == SCENE.total_frames and summary['rollovers'] >= 2
    return runner.trajectory, summary


def imu_run(imu, **config) -> ImuRun:
    """Return the route IMU's settings for the run: its topic, its true mounting."""
    return ImuRun(ImuConfig(topic='/imu', **config), tuple(imu.imu_from_camera.ravel()),
                  'imu_truth')


def test_imu_metric_ate_is_close_to_the_rgbd_path(tmp_path):
    """Colour + IMU in the session: metric ATE within 5 % of the RGB-D path's or of 1 cm."""
    imu = write_route_bag(tmp_path / 'bag')
    gt = frame_poses(SCENE)
    rgbd, _ = replay(tmp_path / 'bag', tmp_path / 'rgbd', metric=True)
    colour, summary = replay(tmp_path / 'bag', tmp_path / 'colour', metric=False,
                             imu=imu_run(imu))
    block = summary['imu']
    assert block['accepted'] == block['readings'] == len(imu.stamps_ns)
    assert sum(block['drops'].values()) == 0 and block['pauses'] == 0
    assert block['lock_stamp_ns'] is not None, block['reason']
    # Every session of 80 keyframes locks its own scale (the oracle's differs per session).
    assert block['locks'] >= 2
    evaluate(block, colour, Trajectory(rgbd.stamps_ns, gt), summary['segments'], imu.gravity)
    assert abs(block['scale_error']) <= 0.02
    assert block['gravity_error_deg'] <= 1.0
    # The poses from the lock on are metres as published: no scale fitted.
    metric = colour.stamps_ns >= block['lock_stamp_ns']
    assert block['metric_poses'] == int(metric.sum()) >= SCENE.total_frames // 2
    ate_imu = metric_ate(Trajectory(colour.stamps_ns[metric], colour.c2w[metric]), gt[metric])
    assert block['metric_ate_m'] == pytest.approx(ate_imu, rel=1e-9)
    ate_rgbd = metric_ate(Trajectory(rgbd.stamps_ns[metric], rgbd.c2w[metric]), gt[metric])
    print(f'metric ATE from the lock ({block["lock_time_s"]} s) on: RGB-D {ate_rgbd:.4f} m, '
          f'colour + IMU {ate_imu:.4f} m, scale error {100 * block["scale_error"]:+.2f} %, '
          f"gravity {block['gravity_error_deg']:.3f} deg, {block['locks']} session locks")
    # Within 5 % of the RGB-D path's ATE, or of a centimetre when both are that small.
    assert ate_imu <= max(1.05 * ate_rgbd, ate_rgbd + 0.01)
    # Before the lock the poses are the model's units: the same as without an IMU.
    plain, _ = replay(tmp_path / 'bag', tmp_path / 'plain', metric=False)
    np.testing.assert_allclose(colour.c2w[~metric], plain.c2w[~metric], rtol=0, atol=1e-9)


def test_a_stopped_imu_pauses_the_fusion_and_the_colour_path_goes_on(tmp_path):
    """The IMU stops after 3 s: one pause, no lock from the gap, every pose, no crash."""
    imu = synthetic_imu(SCENE, seed=3)
    cut = SCENE.start_ns + 3 * SEC
    with bag_io.BagWriter(tmp_path / 'bag') as bag:
        for i in range(SCENE.total_frames):
            stamp = SCENE.start_ns + i * SEC // 10
            bag.write('/cam/image', stamp,
                      bag_io.image_message(frame_image(i, SIZE_HW), stamp, 'cam'))
        for topic, stamp, msg in bag_messages(imu, '/imu'):
            if stamp < cut:
                bag.write(topic, stamp, msg)
    _, summary = replay(tmp_path / 'bag', tmp_path / 'out', metric=False, imu=imu_run(imu))
    block = summary['imu']
    assert block['pauses'] == 1 and block['stream_state'] == 'silent'
    assert block['lock_stamp_ns'] is None and block['state'] != 'locked'
    assert block['accepted'] == int(np.sum(imu.stamps_ns < cut))


def test_make_bag_imu_and_run_with_imu_topic(tmp_path):
    """The command line: IMU topic and truth written; run --imu-topic adds the imu block."""
    bag = tmp_path / 'bag'
    assert main(['make-bag', '--synthetic', '--imu', '--frames', '40', '--size', '64x36',
                 '--imu-time-offset', '0.005', '--out', str(bag)]) == 0
    truth = json.loads((tmp_path / 'bag_imu.json').read_text())
    assert truth['topic'] == '/camera/imu' and truth['time_offset_s'] == pytest.approx(0.005)
    with bag_io.open_bag(bag) as reader:
        topics = bag_io.list_topics(reader)
        assert topics['/camera/imu'].num_messages == 39 * 20 + 50 + 1
        first = next(bag_io.read_raw(reader, ['/camera/imu']))
        msg = bag_io.deserialize(first)
    assert msg.header.frame_id == 'imu_link'
    stamp = msg.header.stamp.sec * SEC + msg.header.stamp.nanosec
    assert stamp == pytest.approx(SceneConfig().start_ns + 5_000_000, abs=1)
    # At rest-free start the reading is the route's: gravity plus motion, about 9.8 m/s^2 up.
    assert 8.0 < np.linalg.norm([msg.linear_acceleration.x, msg.linear_acceleration.y,
                                 msg.linear_acceleration.z]) < 14.0
    out = tmp_path / 'out'
    assert main(['run', str(bag), '--out', str(out), '--params-file',
                 str(find_config('demo_tiny_cpu.yaml')), '--torch-threads', '1',
                 '--set', 'stream.image_width=112', '--set', 'cache.scale_frames=2',
                 '--imu-topic', '/camera/imu', '--imu-truth', str(tmp_path / 'bag_imu.json'),
                 '--gt', str(tmp_path / 'bag_gt.tum')]) == 0
    block = json.loads((out / 'summary.json').read_text())['imu']
    assert block['readings'] == block['accepted'] == 39 * 20 + 50 + 1
    assert block['time_offset_s'] == pytest.approx(0.005)
    assert block['state'] in ('waiting', 'settling', 'locked', 'degenerate')
    # Random weights: whatever the poses, a scale only from windows the checks passed.
    assert (block['scale'] is None) == (block['samples'] == 0)


def test_make_bag_imu_needs_synthetic(tmp_path):
    """--imu without --synthetic is a usage error (exit 1, nothing written)."""
    assert main(['make-bag', '--images', str(tmp_path), '--imu', '--out',
                 str(tmp_path / 'bag')]) == 1
    assert not (tmp_path / 'bag').exists()


def test_make_bag_imu_with_a_rig_writes_the_primarys_imu(tmp_path):
    """--cameras 2 --imu: one IMU topic beside camera 0, the readings of its route."""
    common = ['make-bag', '--synthetic', '--imu', '--frames', '12', '--size', '48x32']
    assert main(common + ['--out', str(tmp_path / 'one')]) == 0
    assert main(common + ['--cameras', '2', '--out', str(tmp_path / 'rig')]) == 0
    truth = json.loads((tmp_path / 'rig_imu.json').read_text())
    assert truth['topic'] == '/cam_0/imu'
    readings = {}
    for name, topic in (('one', '/camera/imu'), ('rig', '/cam_0/imu')):
        with bag_io.open_bag(tmp_path / name) as reader:
            topics = bag_io.list_topics(reader)
            assert [t for t in topics if t.endswith('imu')] == [topic]
            msgs = [bag_io.deserialize(raw) for raw in bag_io.read_raw(reader, [topic])]
        readings[name] = np.array([[m.header.stamp.sec * SEC + m.header.stamp.nanosec,
                                    m.angular_velocity.x, m.angular_velocity.z,
                                    m.linear_acceleration.x, m.linear_acceleration.z]
                                   for m in msgs])
    assert len(readings['rig']) == 11 * 20 + 50 + 1
    # Camera 0 drives the single camera's route: the same readings, noise included.
    np.testing.assert_allclose(readings['rig'], readings['one'], rtol=0, atol=1e-12)
    gt0 = (tmp_path / 'rig_gt_cam0.tum').read_text().split('\n')
    assert any(line and not line.startswith('#') for line in gt0)
