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
"""The metric scale of a session: a robust ratio of sensor depth to predicted depth.

:func:`estimate_scale` compares the model's depth (one unknown scale per session) with a depth
camera's (metres), pixel by pixel, in log space: ``r = log(sensor) - log(predicted)``.

1. A pixel is valid when both depths are finite and > 0, the sensor depth is at most
   ``max_range_m`` (when given) and, with a confidence map, its confidence is at or above the
   median confidence of its frame.
2. ``m = median(r)`` and the scaled MAD ``s = 1.4826 * median(|r - m|)`` (a standard deviation
   for Gaussian noise). Inliers lie within ``3 s`` of ``m``; ``s`` is at least 16 ulps, so
   with exact data every pixel that agrees with the median to round-off is an inlier.
3. The scale is ``exp(median(r over the inliers))``; ``spread`` is the scaled MAD of the
   inliers' log-ratios (0.01 is about 1 % per-pixel disagreement).
4. A scale outside :data:`SCALE_RANGE` is refused: the result is degenerate with the reason.
   The model's depths are about 1 over a session's first frames and a sensor measures between
   1 mm and 1 km (``engine/image/sensor_depth.py``), so a ratio beyond [1e-3, 1e3] metres per
   model unit is a broken sensor or model, never a scene.

Medians are one bracketed ``np.partition`` each (O(n), :func:`_select`), and the log-space
statistics are computed on the ratios (log is monotonic), so only scalars are logged: the
estimate is a few passes over the pixels per frame (its cost: docs/odometry.md, 'Metric scale
from a depth camera'; ``test/engine/test_metric_scale.py -m slow -s`` measures it).
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Any

import numpy as np

MAD_TO_SIGMA = 1.4826
"""Scaled MAD: the MAD of a Gaussian times this is its standard deviation."""
INLIER_MADS = 3.0
"""Inliers lie within this many scaled MADs of the median log-ratio."""
SCALE_RANGE = (1e-3, 1e3)
"""Plausible metres per model unit (step 4 of the module docstring)."""
_SMALL = 20_000
"""Arrays up to this size are partitioned directly."""
_SAMPLE = 4096
"""About this many values bracket a rank in a large array."""


@dataclass(frozen=True, slots=True)
class ScaleEstimate:
    """What :func:`estimate_scale` measured."""

    scale: float
    """Metres per model unit (> 0); ``fallback_scale`` when ``degenerate``."""
    valid_fraction: float
    """Valid pixels / all pixels."""
    inlier_fraction: float
    """Of the valid pixels, those within 3 scaled MADs of the median log-ratio (0 if none)."""
    spread: float
    """Scaled MAD of the inliers' log-ratios (NaN when degenerate)."""
    degenerate: bool
    """Fewer valid pixels than ``min_valid_fraction``, or an implausible scale: ``scale`` is
    the fallback."""
    num_valid: int = 0
    """Number of valid pixels."""
    reason: str = ''
    """Why it is degenerate ('' when it is not): too few valid pixels, or a scale outside
    :data:`SCALE_RANGE`."""
    implausible: bool = False
    """A scale was measured but refused: it is outside :data:`SCALE_RANGE`."""


def estimate_scale(predicted_depth: Any, sensor_depth: Any, *, confidence: Any = None,
                   min_valid_fraction: float = 0.05, max_range_m: float | None = None,
                   fallback_scale: float = 1.0) -> ScaleEstimate:
    """Estimate the metres-per-model-unit factor of predicted depth (module docstring).

    Args:
        predicted_depth: ``[H, W]`` or ``[N, H, W]`` model depth (> 0 where valid); numpy or a
            torch tensor.
        sensor_depth: the same shape, metres (0 or NaN where the sensor has no value).
        confidence: optional, the same shape; higher is better.
        min_valid_fraction: below this share of valid pixels the result is degenerate.
        max_range_m: sensor depths beyond this are not used (None: no limit).
        fallback_scale: the scale of a degenerate result (finite, > 0).

    Returns:
        The estimate.

    Raises:
        ValueError: shapes differ or are not 2-D / 3-D; ``min_valid_fraction`` or
            ``max_range_m`` negative or not finite; ``fallback_scale`` not finite and > 0.
    """
    _check_number('min_valid_fraction', min_valid_fraction)
    if max_range_m is not None:
        _check_number('max_range_m', max_range_m)
    if not (isinstance(fallback_scale, (int, float)) and math.isfinite(fallback_scale)
            and fallback_scale > 0):
        raise ValueError(f'fallback_scale={fallback_scale!r} must be a finite number > 0')
    pred, sensor = _as_array(predicted_depth), _as_array(sensor_depth)
    if pred.shape != sensor.shape:
        raise ValueError(f'predicted_depth has shape {pred.shape}, sensor_depth '
                         f'{sensor.shape}; they must be the same')
    if pred.ndim not in (2, 3):
        raise ValueError(f'depths must be [H, W] or [N, H, W], got shape {pred.shape}')
    conf = None if confidence is None else _as_array(confidence)
    if conf is not None and conf.shape != pred.shape:
        raise ValueError(f'confidence has shape {conf.shape}, the depths {pred.shape}; they '
                         'must be the same')
    dtype = np.result_type(pred.dtype, sensor.dtype, np.float32)
    if not np.issubdtype(dtype, np.floating):
        dtype = np.float64
    pred, sensor = pred.astype(dtype, copy=False), sensor.astype(dtype, copy=False)
    # NaN fails '> 0'; an infinite depth gives a non-finite ratio, refused below.
    valid = (pred > 0) & (sensor > 0)
    if max_range_m is not None:
        valid &= sensor <= max_range_m
    if conf is not None:
        valid &= _confident(conf)
    ratio = sensor[valid]
    ratio /= pred[valid]
    finite = (ratio > 0) & (ratio < np.inf)  # an infinite depth gives 0 or Inf here
    if not finite.all():
        ratio = ratio[finite]
    num_valid = int(ratio.size)
    valid_fraction = num_valid / valid.size if valid.size else 0.0
    if num_valid == 0 or valid_fraction < min_valid_fraction:
        return ScaleEstimate(float(fallback_scale), valid_fraction, 0.0, math.nan, True,
                             num_valid, f'{valid_fraction:.3g} of the pixels have a valid '
                             f'depth pair (min_valid_fraction {min_valid_fraction:g})')
    # log is monotonic, so medians and MAD bounds of the log-ratios are taken on the ratios
    # themselves and only the few scalars are logged: |log(q / m)| <= k  <=>  q in
    # [m e^-k, m e^k].
    median = _median(ratio)
    sigma = max(MAD_TO_SIGMA * _log_mad(ratio, median), _round_off(ratio.dtype))
    bound = math.exp(INLIER_MADS * sigma)
    inliers = ratio[(ratio >= median / bound) & (ratio <= median * bound)]
    centre = _median(inliers)
    spread = MAD_TO_SIGMA * _log_mad(inliers, centre)
    if not SCALE_RANGE[0] <= centre <= SCALE_RANGE[1]:
        return ScaleEstimate(float(fallback_scale), valid_fraction, inliers.size / num_valid,
                             math.nan, True, num_valid,
                             f'scale {centre:.3g} m per model unit is outside the plausible '
                             f'[{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}]', implausible=True)
    return ScaleEstimate(centre, valid_fraction, inliers.size / num_valid, spread, False,
                         num_valid)


def _log_mad(ratio: np.ndarray, centre: float) -> float:
    """``median(|log(ratio / centre)|)`` as ``log(median(max(q, 1 / q)))``, q = ratio/centre."""
    folded = ratio / centre
    np.maximum(folded, np.reciprocal(folded), out=folded)
    return math.log(_median(folded))


def _median(values: np.ndarray) -> float:
    """Median of a 1-D array without NaN (read only)."""
    half = values.size // 2
    if values.size % 2:
        return float(_select(values, (half,))[0])
    lower, upper = _select(values, (half - 1, half))
    return 0.5 * (float(lower) + float(upper))


def _select(values: np.ndarray, ranks: tuple[int, ...]) -> np.ndarray:
    """Return the elements of the given ranks (0-based, ascending), as ``np.partition`` finds them.

    ``np.partition`` slows down several times when many values equal the one sought (exact
    depth pairs give that: most ratios are the same float), so a strided sample first brackets
    the ranks; one pass counts what lies below and inside the bracket, and only the inside is
    partitioned, or nothing when the bracket is a single value. The result is exact: when the
    bracket misses, the whole array is partitioned.
    """
    if values.size <= _SMALL:
        return np.partition(values, ranks)[list(ranks)]
    sample = np.sort(values[::max(1, values.size // _SAMPLE)])
    margin = 4.0 * np.sqrt(sample.size) + 2
    lo_at = int(max(0, min(ranks) * sample.size / values.size - margin))
    hi_at = int(min(sample.size - 1, max(ranks) * sample.size / values.size + margin))
    lo, hi = sample[lo_at], sample[hi_at]
    below = int(np.count_nonzero(values < lo))
    inside_mask = values <= hi
    inside_count = int(np.count_nonzero(inside_mask)) - below
    if not all(below <= r < below + inside_count for r in ranks):
        return np.partition(values, ranks)[list(ranks)]
    if lo == hi:
        return np.full(len(ranks), lo)
    inside = values[inside_mask & (values >= lo)]
    local = tuple(r - below for r in ranks)
    return np.partition(inside, local)[list(local)]


def _round_off(dtype: np.dtype) -> float:
    """Smallest scaled MAD worth trusting: ratios of exact data differ by a few ulps."""
    return 16.0 * float(np.finfo(dtype).eps)


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f'{name}={value!r} must be a number')
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f'{name}={value} must be finite and >= 0')


def _as_array(value: Any) -> np.ndarray:
    """Numpy view of an array-like; a torch tensor is detached and copied to the host."""
    if hasattr(value, 'detach') and hasattr(value, 'cpu'):
        value = value.detach().cpu()
        if str(value.dtype) in ('torch.bfloat16', 'torch.float16'):
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def _confident(conf: np.ndarray) -> np.ndarray:
    """Pixels whose confidence is at or above the median confidence of their frame.

    Non-finite confidences are no confidence at all: left out of the median and refused.
    """
    frames = conf.reshape(1 if conf.ndim == 2 else conf.shape[0], -1)
    finite = np.isfinite(frames)
    keep = np.zeros(frames.shape, dtype=bool)
    for i, (row, ok) in enumerate(zip(frames, finite)):
        values = row if ok.all() else row[ok]
        if values.size:
            keep[i] = ok & (row >= _median(values))
    return keep.reshape(conf.shape)
