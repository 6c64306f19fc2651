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
"""Metric scale per session (MetricSession inside RolloverSession) with the oracle network.

The oracle (oracle_model.py) answers each session with the ground truth seen through a random
Sim(3): its poses and depth are the ground truth divided by an unknown per-session factor,
plus noise. The "depth camera" gives the ground-truth depth in metres (with holes and
outliers). The stitched trajectory, the depth and the map must come out in metres.

Run: ``OMP_NUM_THREADS=1 python -m pytest test/engine/test_metric_session.py`` (seconds).
"""

from __future__ import annotations

from lingbot_map_ros.config import MapConfig, MetricConfig
from lingbot_map_ros.engine.map.map_accumulator import MapAccumulator
from lingbot_map_ros.engine.session.metric_session import MetricSession
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.engine.session.stitching import align_sim3, Sim3Alignment
from lingbot_map_ros.engine.session.stream_feeder import StreamFeeder
import numpy as np
# oracle_model sits next to this file (pytest puts test/engine on sys.path).
from oracle_model import frame_image, ground_truth, oracle_session
import pytest

SEC = 10**9
STAMP0 = 100 * SEC
SIZE_HW = (48, 64)
SESSION = {'stream.session_keyframes': 16, 'stream.overlap_keyframes': 4,
           'stream.enable_depth': True}


def plane_m(index: int) -> float:
    """Return the oracle's ground-truth depth of frame ``index`` (a plane), metres."""
    return 2.0 + 0.5 * np.sin(0.05 * index)


def sensor_depth(index: int, rng: np.random.Generator) -> np.ndarray:
    """Return a depth camera's image of frame ``index``: holes (0, NaN), 10 % wild pixels."""
    depth = np.full(SIZE_HW, plane_m(index), np.float32)
    depth[:, :6] = 0.0
    depth[:4] = np.nan
    wild = rng.random(SIZE_HW) < 0.1
    depth[wild] = rng.uniform(0.2, 10.0, wild.sum())
    return depth


def run(num: int, depth_for=lambda i: True, settle: int = 6, seed: int = 3, **values):
    """Feed ``num`` frames; frame i has sensor depth when ``depth_for(i)``."""
    gt = ground_truth(num + 10)
    session, oracle = oracle_session(gt, noise=0.002, seed=seed, depth_noise=0.02,
                                     **{**SESSION, **values})
    rollover = RolloverSession(session, MetricConfig(source='depth', settle_keyframes=settle))
    feeder = StreamFeeder(rollover)
    rng = np.random.default_rng(seed)
    preds, states = [], []
    for i in range(num):
        stamp = STAMP0 + i * SEC // 10
        if depth_for(i):
            rollover.metric.provide_depth(stamp, sensor_depth(i, rng))
        fed = feeder.feed(frame_image(i, SIZE_HW), stamp)
        assert fed.accepted and not fed.resets, (i, fed)
        preds += fed.predictions
        states.append(rollover.metric.stats().state)
    preds += rollover.flush()
    return preds, rollover, oracle, gt[:num], states


def metric_scale_of(preds: list, gt: np.ndarray) -> float:
    """Scale of the one Sim(3) that maps the published trajectory onto the ground truth."""
    return align_sim3(gt, np.stack([p.c2w for p in preds])).scale


def rms_radius(points: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.sum((points - points.mean(axis=0)) ** 2, axis=1))))


def test_trajectory_depth_and_map_are_metric_over_many_rollovers():
    num = 140
    preds, rollover, oracle, gt, _ = run(num)
    stats = rollover.rollover_stats()
    assert stats.rollovers >= 5 and [p.stamp_ns for p in preds] == \
        [STAMP0 + i * SEC // 10 for i in range(num)]
    # Each session had its own unknown factor, spread over e^-1 .. e^1.
    factors = [1.0 / s for s, _, _ in oracle.sessions[1:]]
    assert max(factors) / min(factors) > 1.5
    assert metric_scale_of(preds, gt) == pytest.approx(1.0, rel=0.02)
    for pred in preds:
        assert np.median(pred.depth) == pytest.approx(plane_m(pred.frame_index), rel=0.02)
    # Every session locked on its own factor; the free Sim(3) fit agrees (the check).
    metric = rollover.metric.stats()
    assert metric.state == 'locked' and metric.degenerate_sessions == 0
    assert metric.scale == pytest.approx(factors[-1], rel=0.02)
    assert metric.sim3_scale == pytest.approx(metric.scale, rel=0.02)
    assert metric.frames_with_depth == num and metric.frames_without_depth == 0
    assert 0.85 < metric.inlier_fraction < 0.95 and metric.valid_fraction > 0.7
    # The map of the published keyframes is the map of the ground truth (rigidly moved).
    ours, truth = MapAccumulator(MapConfig(voxel_size=0.02)), MapAccumulator(
        MapConfig(voxel_size=0.02))
    for pred in (p for p in preds if p.is_keyframe):
        truth_depth = np.full_like(pred.depth, plane_m(pred.frame_index))
        ours.add(pred.depth, None, None, pred.intrinsics, pred.c2w)
        truth.add(truth_depth, None, None, pred.intrinsics, gt[pred.frame_index])
    assert rms_radius(ours.points()[0]) == pytest.approx(rms_radius(truth.points()[0]),
                                                         rel=0.02)


def test_states_progress_and_the_scale_is_held_after_settling():
    # No depth for the first 3 frames: the scale phase (2 frames) runs without it.
    preds, rollover, oracle, gt, states = run(12, depth_for=lambda i: i >= 3, settle=6,
                                              **{'stream.session_keyframes': 40})
    # Frame 1 ends the scale phase (no depth), frame 2 also none; from frame 3 on: settling.
    assert states[:3] == ['waiting'] * 3
    assert states[3:5] == ['settling'] * 2
    assert states[5:] == ['locked'] * 7
    stats = rollover.metric.stats()
    assert stats.session_keyframes == 12 and stats.frames_without_depth == 3
    # Held: the session's factor, whatever later frames say.
    assert stats.scale == pytest.approx(1.0 / oracle.sessions[0][0], rel=0.02)
    # Frames 0..2 were published before any scale: model units, as without a depth camera.
    assert np.median(preds[0].depth) == pytest.approx(oracle.sessions[0][0] * plane_m(0),
                                                      rel=0.05)
    assert np.median(preds[11].depth) == pytest.approx(plane_m(11), rel=0.02)


def test_a_session_without_depth_is_degenerate_and_keeps_the_rollover_alignment():
    # Depth stops at frame 40: the sessions after it settle without a scale and fall back
    # to today's stitching (Sim(3) / depth ratio), which carries the metric scale on.
    num = 90
    preds, rollover, _, gt, states = run(num, depth_for=lambda i: i < 40)
    assert 'degenerate' in states and states[-1] == 'degenerate'
    metric = rollover.metric.stats()
    assert metric.degenerate_sessions >= 2 and metric.scale is None
    assert metric.frames_without_depth == num - 40
    assert metric_scale_of(preds, gt) == pytest.approx(1.0, rel=0.02)


def test_without_a_depth_camera_nothing_changes():
    gt = ground_truth(40)
    outputs = []
    for metric in (None, MetricConfig(source='depth', settle_keyframes=4)):
        session, _ = oracle_session(gt, noise=0.002, seed=5, depth_noise=0.02, **SESSION)
        rollover = RolloverSession(session, metric)
        feeder = StreamFeeder(rollover)
        preds = []
        for i in range(40):  # with a metric config but no depth handed over: degenerate
            preds += feeder.feed(frame_image(i, SIZE_HW), STAMP0 + i * SEC // 10).predictions
        outputs.append(np.stack([p.c2w for p in preds]))
    assert rollover.metric.stats().state == 'degenerate'
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=0, atol=1e-12)


def test_off_hands_the_rollover_mapping_through():
    off = MetricSession(MetricConfig(), overlap_keyframes=4, scale_frames=2)
    fit = Sim3Alignment(2.0, np.eye(3), np.ones(3), 0.0, False)
    off.provide_depth(1, np.ones(SIZE_HW, np.float32))
    assert off.alignment(fit) is fit and off.alignment(None) is None
    assert off.stats().state == 'off' and off.stats().scale is None


@pytest.mark.parametrize('values, message', [
    ({'metric.source': 'lidar'}, 'metric.source'), ({'metric.max_dt_s': -0.1}, 'max_dt_s'),
    ({'metric.max_range_m': float('nan')}, 'max_range_m'),
    ({'metric.min_valid_fraction': 1.5}, 'min_valid_fraction'),
    ({'metric.settle_keyframes': 0}, 'settle_keyframes'), ({'metric.bogus': 1}, 'metric.bogus')])
def test_metric_config_refuses_bad_values(values, message):
    with pytest.raises(ValueError, match=message):
        MetricConfig.from_flat({'map.voxel_size': 0.1, **values})
    assert MetricConfig.from_flat({'metric.source': 'depth', 'map.enable': True}).enabled
