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
"""Metric replay: ``make-bag --synthetic --depth`` and ``run --depth-topic`` / ``OfflineRunner``.

Run: ``pytest test/tools/test_metric_replay.py`` (20-30 s on 2 cores). The metric accuracy is
checked with the oracle network (test/engine/oracle_model.py: poses and depth are the ground
truth divided by an unknown factor per session) over many rollovers; the command line with the
tiny random-weight model.
"""

import json
from pathlib import Path
import sys

from lingbot_map_ros.config import MapConfig, MetricConfig
from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.engine.image.preprocess import preprocess_array
from lingbot_map_ros.engine.image.sensor_depth import to_processed
from lingbot_map_ros.engine.map.map_accumulator import MapAccumulator
from lingbot_map_ros.engine.map.ply import read_ply
from lingbot_map_ros.engine.metric_scale import estimate_scale
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.ros.inference.depth_input import depth_msg_to_metres
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.bag_io import depth_message
from lingbot_map_ros.tools.offline import OfflineRunner, RunOptions
from lingbot_map_ros.tools.replay import find_config, main
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
from oracle_model import frame_image, ground_truth, oracle_session  # noqa: E402,I100,I202

SEC = 1_000_000_000
SIZE_HW = (48, 64)
MAP = MapConfig(voxel_size=0.02, confidence_percentile=0.0, pixel_stride=2)

torch.set_num_threads(1)


def plane_m(index: int) -> float:
    """Return the oracle's ground-truth depth of frame ``index`` (a plane), metres."""
    return 2.0 + 0.5 * np.sin(0.05 * index)


def rms_radius(points: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.sum((points - points.mean(axis=0)) ** 2, axis=1))))


def test_make_bag_synthetic_depth_is_the_scenes_depth_in_millimetres(tmp_path):
    bag = tmp_path / 'bag'
    assert main(['make-bag', '--synthetic', '--depth', '--frames', '4', '--size', '64x36',
                 '--out', str(bag)]) == 0
    seq = render_sequence(SceneConfig(width=64, height=36, num_frames=4))
    with bag_io.open_bag(bag) as reader:
        topics = bag_io.list_topics(reader)
        assert topics['/camera/depth/image_raw'].num_messages == 4
        order = [(m.topic, bag_io.deserialize(m)) for m in bag_io.read_raw(
            reader, ['/camera/depth/image_raw', '/camera/image_raw'])]
    # Each depth image comes just before the colour image of the same stamp.
    assert [t for t, _ in order] == ['/camera/depth/image_raw', '/camera/image_raw'] * 4
    depths = [msg for topic, msg in order if topic.endswith('depth/image_raw')]
    for i, msg in enumerate(depths):
        assert (msg.encoding, msg.height, msg.width, msg.step) == ('16UC1', 36, 64, 128)
        assert msg.header.stamp.sec * SEC + msg.header.stamp.nanosec == seq.stamps_ns[i]
        np.testing.assert_allclose(depth_msg_to_metres(msg), seq.depth[i], atol=5e-4 + 1e-6)
    assert main(['make-bag', '--images', str(tmp_path), '--depth', '--out',
                 str(tmp_path / 'no')]) == 1  # only the synthetic scene knows its depth


def write_oracle_bag(path: Path, num: int, rng: np.random.Generator) -> None:
    """Colour frames that encode their index, and their ground-truth depth (holes, wild)."""
    with bag_io.BagWriter(path) as bag:
        for i in range(num):
            stamp = 50 * SEC + i * SEC // 10
            depth = np.full(SIZE_HW, plane_m(i))
            depth[:, :6] = 0.0
            wild = rng.random(SIZE_HW) < 0.1
            depth[wild] = rng.uniform(0.2, 10.0, wild.sum())
            # Depth recorded after its colour image for odd frames: both orders pair.
            msgs = [('/cam/image', bag_io.image_message(frame_image(i, SIZE_HW), stamp, 'cam')),
                    ('/cam/depth', depth_message(depth, stamp, 'cam'))]
            for topic, msg in (msgs if i % 2 else msgs[::-1]):
                bag.write(topic, stamp, msg)


def test_offline_replay_with_the_oracle_is_metric_over_rollovers(tmp_path):
    num = 100
    write_oracle_bag(tmp_path / 'bag', num, np.random.default_rng(4))
    gt = ground_truth(num + 10)
    session, oracle = oracle_session(
        gt, noise=0.002, seed=6, depth_noise=0.02, **{
            'stream.session_keyframes': 16, 'stream.overlap_keyframes': 4,
            'stream.enable_depth': True})
    metric = MetricConfig(source='depth', settle_keyframes=6)
    options = RunOptions(map_axes='optical', save_ply=True, map=MAP, metric=metric,
                         depth_topic='/cam/depth')
    runner = OfflineRunner(RolloverSession(session, metric), options, tmp_path / 'out')
    with bag_io.open_bag(tmp_path / 'bag') as reader:
        summary = runner.run(bag_io.read_raw(reader, ['/cam/image', '/cam/depth']))
    assert summary['frames_read'] == summary['poses'] == num and summary['drops'] == {}
    assert summary['rollovers'] >= 5 and len(oracle.sessions) >= 6
    assert summary['metric']['state'] == 'locked'
    assert summary['metric']['frames_with_depth'] == num
    assert summary['metric']['degenerate_sessions'] == 0
    assert 'metres' in runner.tum_comments(summary)[1]
    traj = runner.trajectory
    assert rms_radius(traj.positions) == pytest.approx(rms_radius(gt[:num, :3, 3]), rel=0.02)
    map_xyz, _ = read_ply(tmp_path / 'out' / 'map.ply')
    k = geometry.pose_encoding_to_intrinsics(np.array([0, 0, 0, 0, 0, 0, 1, 1.0, 1.2]),
                                             (42, 56))
    reference = MapAccumulator(MAP)
    for i in range(num):
        reference.add(np.full((42, 56), plane_m(i), np.float32), None, None, k, gt[i])
    assert rms_radius(map_xyz) == pytest.approx(rms_radius(reference.points()[0]), rel=0.02)


def test_run_with_depth_topic_on_the_synthetic_bag(tmp_path):
    bag = tmp_path / 'bag'
    assert main(['make-bag', '--synthetic', '--depth', '--frames', '8', '--size', '128x72',
                 '--out', str(bag)]) == 0
    out = tmp_path / 'out'
    code = main(['run', str(bag), '--out', str(out), '--params-file',
                 str(find_config('demo_tiny_cpu.yaml')), '--torch-threads', '1',
                 '--set', 'stream.image_width=112', '--set', 'cache.scale_frames=2',
                 '--set', 'metric.settle_keyframes=4', '--depth-topic',
                 '/camera/depth/image_raw', '--depth'])
    assert code == 0
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['topic'] == '/camera/image_raw' and summary['poses'] == 8
    assert summary['metric']['state'] == 'locked' and summary['metric']['scale'] > 0
    assert summary['metric']['frames_with_depth'] == 8
    assert summary['config']['stream.enable_depth'] is True
    assert 'metres' in (out / 'trajectory.tum').read_text().splitlines()[1]
    # The saved depth is the model's times the session's factor, the weighted median of the
    # estimates of its first batches (the 2 scale frames, then frames 2 and 3): measured on
    # the saved depth, one of them is 1.
    seq = render_sequence(SceneConfig(width=128, height=72, num_frames=8))
    _, info = preprocess_array(seq.images[0], 112, 14)
    saved = [np.load(out / 'depth' / f'{stamp}.npz') for stamp in seq.stamps_ns]
    estimates = [estimate_scale(np.stack([saved[i]['depth'] for i in batch]),
                                np.stack([to_processed(seq.depth[i], info) for i in batch]),
                                confidence=np.stack([saved[i]['depth_conf'] for i in batch])
                                ).scale for batch in ([0, 1], [2], [3])]
    assert min(abs(e - 1.0) for e in estimates) < 1e-4, estimates
    assert main(['run', str(bag), '--out', str(tmp_path / 'x'), '--allow-random-weights',
                 '--device', 'cpu', '--set', 'metric.source=depth']) == 1  # no --depth-topic
