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
"""Sensor depth outside the physical range is no measurement; an implausible scale is refused.

Issue #36: a session of ~1e9 m sensor depth gave poses of 7e8 m, 3e38 m gave 1.9e38 m and
1e-40 m gave 7e-41 m, with the metric state ``settling``. Here the metric layer gets real
``FramePrediction`` keyframes (model depth 2.0 everywhere) with such sensor depths.
"""

from __future__ import annotations

from lingbot_map_ros.config import MetricConfig
from lingbot_map_ros.engine.frames import FrameTag
from lingbot_map_ros.engine.image.preprocess import preprocess_array
from lingbot_map_ros.engine.image.sensor_depth import (MAX_DEPTH_M, MIN_DEPTH_M, to_processed,
                                                       valid_mask)
from lingbot_map_ros.engine.metric_scale import estimate_scale, SCALE_RANGE
from lingbot_map_ros.engine.session.metric_session import MetricSession
from lingbot_map_ros.engine.session.prediction import FramePrediction
import numpy as np
import pytest
import torch

SEC = 1_000_000_000
MODEL_DEPTH = 2.0


def _keyframe(index: int, info, model_depth: float = MODEL_DEPTH) -> FramePrediction:
    height, width = info.image_size_hw
    return FramePrediction(
        frame_index=index, tag=FrameTag(index * SEC), role='keyframe', time_index=index,
        pose_enc=np.zeros(9), c2w=np.eye(4), intrinsics=np.eye(3),
        intrinsics_original=np.eye(3), preprocess=info,
        network_input=torch.zeros(3, height, width),
        depth=torch.full((height, width), model_depth), depth_conf=None)


def _session_with(sensor_m: float, frames: int = 6, model_depth: float = MODEL_DEPTH,
                  caplog=None) -> MetricSession:
    _, info = preprocess_array(np.zeros((40, 56, 3), np.uint8), 56, 14)
    metric = MetricSession(MetricConfig(source='depth', settle_keyframes=100), 4, 2)
    for i in range(frames):
        metric.provide_depth(i * SEC, np.full(info.original_size_hw, sensor_m, np.float32))
        metric.observe([_keyframe(i, info, model_depth)])
    return metric


def test_a_plausible_sensor_gives_its_scale():
    stats = _session_with(3.0).stats()
    assert stats.state == 'settling' and stats.reason == ''
    assert stats.scale == pytest.approx(3.0 / MODEL_DEPTH, rel=1e-6)


@pytest.mark.parametrize('sensor_m', [1e9, 3e38, 1e-40, 1e-4, 1500.0])
def test_sensor_depth_outside_the_physical_range_gives_no_scale(sensor_m):
    stats = _session_with(sensor_m).stats()
    # e67d60d: 'settling' with scale sensor_m / 2 (poses of 7e8 m from 1e9 m depth).
    assert stats.state == 'waiting' and stats.scale is None
    assert stats.valid_fraction == pytest.approx(0.0, abs=1e-12)
    assert 'valid depth pair' in stats.reason


def test_an_implausible_scale_is_refused_degenerate_with_the_reason(caplog):
    # 100 m of sensor depth against a model depth of 1e-3: 1e5 m per model unit.
    with caplog.at_level('WARNING'):
        stats = _session_with(100.0, model_depth=1e-3).stats()
    assert stats.state == 'degenerate' and stats.scale is None
    assert 'outside the plausible' in stats.reason and '1e+05' in stats.reason
    assert any('metric scale refused' in r.getMessage() for r in caplog.records)


def test_estimate_scale_refuses_a_ratio_outside_the_range():
    pred = np.full((8, 8), 1e-4)
    for factor, implausible in ((SCALE_RANGE[1] * 2, True), (SCALE_RANGE[0] / 2, True),
                                (SCALE_RANGE[1] / 2, False)):
        out = estimate_scale(pred, pred * factor)
        assert out.implausible == implausible and out.degenerate == implausible
        expected = 1.0 if implausible else factor
        assert out.scale == pytest.approx(expected, rel=1e-6)


def test_the_physical_range_per_pixel():
    depth = np.array([[0.0, np.nan, np.inf, -1.0, MIN_DEPTH_M / 2, MIN_DEPTH_M,
                       5.0, MAX_DEPTH_M, MAX_DEPTH_M * 2]], np.float32)
    assert valid_mask(depth).tolist() == [[False] * 5 + [True] * 3 + [False]]
    assert valid_mask(depth, max_range_m=4.0)[0, 6] == np.False_
    _, info = preprocess_array(np.zeros((18, 18, 3), np.uint8), 14, 14)
    image = np.resize(depth, (18, 18))  # every kind of value, repeated
    out = to_processed(image, info)
    assert np.isfinite(out).all() and float(out.max()) <= MAX_DEPTH_M
    kept = out[out > 0]
    assert kept.size and np.all((kept >= MIN_DEPTH_M) & (kept <= MAX_DEPTH_M))


def test_depth_held_for_frames_not_predicted_yet_is_bounded_in_bytes():
    from lingbot_map_ros.engine.session import metric_session

    metric = MetricSession(MetricConfig(source='depth'), 4, 100)  # count bound: 208
    one = np.ones((1024, 1024), np.float32)  # 4 MiB
    for i in range(100):
        metric.provide_depth(i * SEC, one)
    held = len(metric.pending_stamps) * one.nbytes
    assert held <= metric_session.MAX_PENDING_BYTES and len(metric.pending_stamps) == 64
    assert metric.pending_stamps == tuple(i * SEC for i in range(36, 100))  # oldest went first
