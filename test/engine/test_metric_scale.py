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
"""The contract of ``estimate_scale`` and the sensor depth's nearest-neighbour preprocessing.

Run: ``python -m pytest test/engine/test_metric_scale.py`` (a second); the timing of four
518 x 392 frames is printed by the ``slow`` benchmark (``-m slow -s``), never asserted.
"""

from __future__ import annotations

import time

from lingbot_map_ros.engine.errors import InvalidFrameError
from lingbot_map_ros.engine.image.preprocess import preprocess_array
from lingbot_map_ros.engine.image.sensor_depth import to_processed
from lingbot_map_ros.engine.metric_scale import estimate_scale
import numpy as np
import pytest
import torch

TRUE = 2.75
"""Metres per model unit in the synthetic pairs."""


def _pair(shape=(4, 48, 64), seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    sensor = rng.uniform(0.3, 8.0, shape).astype(dtype)
    return (sensor / TRUE).astype(dtype), sensor


@pytest.mark.parametrize('dtype', [np.float32, np.float64])
def test_exact_input_gives_the_ratio_to_round_off(dtype):
    pred, sensor = _pair(dtype=dtype)
    out = estimate_scale(pred, sensor)
    eps = float(np.finfo(dtype).eps)
    assert out.scale == pytest.approx(TRUE, rel=8 * eps)
    assert not out.degenerate
    assert out.valid_fraction == pytest.approx(1.0)
    assert out.inlier_fraction == pytest.approx(1.0)
    assert 0.0 <= out.spread < 1e3 * eps


def test_single_frame_and_torch_tensors():
    pred, sensor = _pair((48, 64))
    out = estimate_scale(torch.from_numpy(pred), torch.from_numpy(sensor),
                         confidence=torch.ones(48, 64))
    assert out.scale == pytest.approx(TRUE, rel=1e-12)
    assert out.valid_fraction == pytest.approx(1.0)  # all confidences equal the median


@pytest.mark.parametrize('fraction', [0.1, 0.3])
@pytest.mark.parametrize('kind', ['high', 'low', 'both'])
def test_thirty_percent_arbitrary_outliers_stay_within_one_percent(fraction, kind):
    pred, sensor = _pair(seed=1)
    rng = np.random.default_rng(2)
    bad = rng.random(sensor.shape) < fraction
    low, high = {'high': (10.0, 1e4), 'low': (1e-4, 0.1), 'both': (1e-4, 1e4)}[kind]
    sensor = np.where(bad, np.exp(rng.uniform(np.log(low), np.log(high), sensor.shape)),
                      sensor)
    out = estimate_scale(pred, sensor)
    assert out.scale == pytest.approx(TRUE, rel=0.01)
    assert out.inlier_fraction == pytest.approx(1.0 - bad.mean(), abs=0.01)


def test_outliers_on_top_of_noise_stay_within_one_percent():
    pred, sensor = _pair((2, 120, 160), seed=3)
    rng = np.random.default_rng(4)
    sensor = sensor * np.exp(rng.normal(0.0, 0.02, sensor.shape))
    bad = rng.random(sensor.shape) < 0.3
    sensor[bad] = rng.uniform(5.0, 50.0, bad.sum())
    out = estimate_scale(pred, sensor)
    assert out.scale == pytest.approx(TRUE, rel=0.01)
    assert out.spread == pytest.approx(0.02, rel=0.25)


def test_holes_nan_inf_and_range_are_not_valid():
    pred, sensor = _pair(seed=5)
    sensor[:, :12] = 0.0           # a quarter: no sensor value
    sensor[:, 12:24, :32] = np.nan  # an eighth more
    pred[:, 24:30] = -1.0          # invalid prediction
    pred[:, 30, :8] = np.inf
    out = estimate_scale(pred, sensor)
    expected_valid = 1.0 - (12 * 64 + 12 * 32 + 6 * 64 + 8) / (48 * 64)
    assert out.valid_fraction == pytest.approx(expected_valid)
    assert out.scale == pytest.approx(TRUE, rel=1e-12)
    far = estimate_scale(pred, sensor, max_range_m=4.0)
    in_range = (sensor <= 4.0) & (sensor > 0) & (pred > 0) & np.isfinite(pred)
    assert far.valid_fraction == pytest.approx(in_range.mean())
    assert far.num_valid == in_range.sum()


def test_confidence_keeps_pixels_at_or_above_each_frames_median():
    pred, sensor = _pair((2, 10, 10), seed=6)
    confidence = np.zeros_like(pred)
    confidence[0] = np.arange(100).reshape(10, 10)          # median 49.5: 50 pixels kept
    confidence[1] = 7.0                                      # all equal: all kept
    # The low-confidence half of frame 0 is wrong: with the threshold it is never used.
    sensor[0].reshape(-1)[:50] *= 3.0
    out = estimate_scale(pred, sensor, confidence=confidence)
    assert out.valid_fraction == pytest.approx(150 / 200)
    assert out.scale == pytest.approx(TRUE, rel=1e-12)
    assert out.inlier_fraction == pytest.approx(1.0)
    # Non-finite confidences are refused and left out of the median.
    confidence[1, 0, :4] = np.nan
    out = estimate_scale(pred, sensor, confidence=confidence)
    assert out.valid_fraction == pytest.approx(146 / 200)


def test_too_few_valid_pixels_is_degenerate_with_the_fallback():
    pred, sensor = _pair(seed=7)
    kept = sensor[0, 0, :10].copy()
    sensor[:] = 0.0
    sensor[0, 0, :10] = kept       # 10 of 12288 pixels
    out = estimate_scale(pred, sensor, fallback_scale=0.42)
    assert out.degenerate and out.scale == 0.42
    assert out.valid_fraction == pytest.approx(10 / sensor.size)
    assert out.inlier_fraction == 0.0 and np.isnan(out.spread)
    # The same pixels pass with a lower threshold.
    out = estimate_scale(pred, sensor, min_valid_fraction=1e-4, fallback_scale=0.42)
    assert not out.degenerate and out.scale == pytest.approx(TRUE, rel=1e-12)
    assert estimate_scale(pred, np.zeros_like(sensor)).degenerate
    assert estimate_scale(pred, sensor, max_range_m=0.5).scale == 1.0


@pytest.mark.parametrize('kwargs', [
    {'min_valid_fraction': -0.1}, {'min_valid_fraction': float('nan')},
    {'min_valid_fraction': float('inf')}, {'max_range_m': -1.0},
    {'max_range_m': float('nan')}, {'max_range_m': float('inf')},
    {'fallback_scale': 0.0}, {'fallback_scale': float('nan')},
])
def test_bad_arguments_raise_value_error(kwargs):
    pred, sensor = _pair()
    with pytest.raises(ValueError):
        estimate_scale(pred, sensor, **kwargs)


def test_bad_shapes_raise_value_error():
    pred, sensor = _pair()
    with pytest.raises(ValueError, match='same'):
        estimate_scale(pred, sensor[:, :-1])
    with pytest.raises(ValueError, match='confidence'):
        estimate_scale(pred, sensor, confidence=np.ones(3))
    with pytest.raises(ValueError, match=r'\[H, W\]'):
        estimate_scale(pred[0, 0], sensor[0, 0])


@pytest.mark.slow
def test_benchmark_four_frames_of_518_by_392():
    """Report (not assert) the time of the contract's case: 4 frames of 518 x 392."""
    for dtype in (np.float32, np.float64):
        pred, sensor = _pair((4, 392, 518), seed=8, dtype=dtype)
        confidence = np.random.default_rng(9).uniform(1, 5, pred.shape).astype(dtype)
        best = {}
        for name, kwargs in (('plain', {}), ('confidence', {'confidence': confidence})):
            times = []
            for _ in range(5):
                start = time.perf_counter()
                out = estimate_scale(pred, sensor, **kwargs)
                times.append(time.perf_counter() - start)
            best[name] = min(times) * 1e3
            assert out.scale == pytest.approx(TRUE, rel=1e-5)
        print(f'\nestimate_scale 4x392x518 {np.dtype(dtype).name}: '
              + ', '.join(f'{k} {v:.1f} ms' for k, v in best.items()) + ' (best of 5)')


def test_sensor_depth_follows_the_colour_crop_nearest_neighbour():
    # A portrait image: resized to width 56 and cropped to a square (crop mode).
    height0, width0 = 200, 80
    rgb = np.zeros((height0, width0, 3), np.uint8)
    _, info = preprocess_array(rgb, 56, 14)
    assert info.crop_top > 0 and info.image_size_hw == (56, 56)
    rows, cols = np.mgrid[0:height0, 0:width0]
    # Each pixel names its position, in millimetres (inside the physical range of a sensor).
    depth = ((1000 * rows + cols) * 1e-3).astype(np.float32)
    out = to_processed(depth, info)
    assert out.shape == info.image_size_hw and out.dtype == np.float32
    src_rows, src_cols = np.divmod(np.rint(out * 1e3).astype(np.int64), 1000)
    # Every processed pixel takes the input pixel nearest to where it sits (PreprocessInfo).
    v, u = np.mgrid[0:56, 0:56]
    y = (v + info.crop_top + 0.5) / info.scale_y - 0.5
    x = (u + 0.5) / info.scale_x - 0.5
    assert np.all(np.abs(src_rows - y) <= 0.5 + 1e-9)
    assert np.all(np.abs(src_cols - x) <= 0.5 + 1e-9)
    # Only values that exist in the input: no interpolation across depth edges.
    edge = np.where(cols < 40, 1.0, 5.0).astype(np.float32)
    assert set(np.unique(to_processed(edge, info))) == {1.0, 5.0}


def test_sensor_depth_invalid_values_and_size_mismatch():
    _, info = preprocess_array(np.zeros((48, 64, 3), np.uint8), 56, 14)
    depth = np.full((48, 64), 2.0, np.float32)
    depth[:, :16] = np.nan
    depth[:, 16:32] = -1.0
    out = to_processed(depth, info)
    assert set(np.unique(out)) == {0.0, 2.0}
    with pytest.raises(InvalidFrameError, match='aligned'):
        to_processed(np.ones((48, 63), np.float32), info)
