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
"""MetricSession: each engine session's scale in metres, from a depth camera.

With ``metric.source: depth`` the caller hands over the sensor depth of a frame
(:meth:`MetricSession.provide_depth`, metres, aligned to the colour image) before feeding it;
:class:`~lingbot_map_ros.engine.session.rollover.RolloverSession` calls the rest:

1. :meth:`~MetricSession.observe` with every batch of predictions, before any of them is
   stitched: the sensor depth is taken to the processed pixels
   (:func:`~lingbot_map_ros.engine.image.sensor_depth.to_processed`) and each batch of keyframes
   gives one :func:`~lingbot_map_ros.engine.metric_scale.estimate_scale` sample (the scale
   frames are one batch, so they are all published with the estimate over all of them).
   The session's scale is the weighted median of its samples (weight: frames), refined until
   the session has seen ``metric.settle_keyframes`` keyframes, then held.
2. :meth:`~MetricSession.alignment` replaces the session -> continuous mapping: ``scale`` times
   the session's poses in the first session after a reset, and the rollover fit with its
   scale replaced by the metric one (``stitching.with_scale``) in later sessions, so the
   Sim(3) alignment needs no scale of its own. Its scale is kept as a check
   (``sim3_scale``). While no scale is known (``waiting``, ``degenerate``), the rollover's
   own mapping is used unchanged (today's behaviour).
3. :meth:`~MetricSession.start_session` at a rollover: the new session's scale frames are the
   overlap keyframes, whose sensor depths are kept here (a ring parallel to the rollover's).

States: ``off`` (no depth source), ``waiting`` (no usable depth yet in this session),
``settling`` (a scale, still refined), ``locked`` (held), ``degenerate`` (the session settled
without a usable depth, or its only estimates were outside the plausible range
:data:`~lingbot_map_ros.engine.metric_scale.SCALE_RANGE`: model units, as without a depth
camera; :attr:`MetricStats.reason` says why). An implausible estimate is never applied: it is
logged (warning) and left out of the session's samples.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from typing import Literal

from lingbot_map_ros.config import MetricConfig
from lingbot_map_ros.engine.errors import InvalidFrameError
from lingbot_map_ros.engine.image.sensor_depth import to_processed
from lingbot_map_ros.engine.metric_scale import estimate_scale, ScaleEstimate
from lingbot_map_ros.engine.session.prediction import FramePrediction, host_maps
from lingbot_map_ros.engine.session.stitching import at_scale, Sim3Alignment
import numpy as np

MetricState = Literal['off', 'waiting', 'settling', 'locked', 'degenerate']
_log = logging.getLogger(__name__)
MAX_PENDING_BYTES = 256 * 1024 * 1024
"""Sensor depth held for frames not predicted yet, at most (besides its count)."""


@dataclasses.dataclass(frozen=True, slots=True)
class MetricStats:
    """What the metric layer reports (every field always set; None: not known yet)."""

    state: MetricState = 'off'
    """'off', 'waiting', 'settling', 'locked' or 'degenerate' (module docstring)."""
    scale: float | None = None
    """Metres per model unit of the current session; None while there is none."""
    valid_fraction: float | None = None
    """Of the last estimate: pixels with a valid depth pair / all pixels."""
    inlier_fraction: float | None = None
    """Of the last estimate: valid pixels that agree with the median ratio."""
    spread: float | None = None
    """Of the last estimate: scaled MAD of the inliers' log-ratios (0.01: about 1 %)."""
    session_keyframes: int = 0
    """Keyframes of the current session seen so far (settles at ``metric.settle_keyframes``)."""
    frames_with_depth: int = 0
    """Frames that had a sensor depth, since start."""
    frames_without_depth: int = 0
    """Frames that had none (no pair within ``metric.max_dt_s``), since start."""
    sim3_scale: float | None = None
    """Scale the last rollover's Sim(3) fit found itself (a check: close to ``scale``)."""
    degenerate_sessions: int = 0
    """Sessions that settled without a metric scale, since start."""
    reason: str = ''
    """Why the last estimate gave no scale ('' when it gave one): too few valid pixels, or a
    scale outside the plausible range."""


class MetricSession:
    """Per-session metric scale from sensor depth (module docstring)."""

    def __init__(self, config: MetricConfig, overlap_keyframes: int, scale_frames: int
                 ) -> None:
        """Start in state ``waiting`` (``off`` without a depth source).

        Args:
            config: the ``metric.*`` settings.
            overlap_keyframes: the rollover's overlap (length of the sensor-depth ring).
            scale_frames: frames a session buffers before its first prediction (bounds the
                depths held for frames not predicted yet).
        """
        self._config = config
        self._pending: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._max_pending = 2 * scale_frames + 8
        self._ring: collections.deque[np.ndarray | None] = collections.deque(
            maxlen=overlap_keyframes)
        self._samples: list[tuple[float, int]] = []
        self._keyframes = 0
        self._locked = False
        self._last: ScaleEstimate | None = None
        self._anchor: tuple[Sim3Alignment, np.ndarray, np.ndarray] | None = None
        self._mapping: tuple[float, Sim3Alignment] | None = None
        self._counts = {'with': 0, 'without': 0, 'degenerate': 0}
        self._sim3_scale: float | None = None
        self._stats = MetricStats()
        self._snapshot()

    @property
    def enabled(self) -> bool:
        """Return True when a depth camera sets the scale."""
        return self._config.enabled

    @property
    def config(self) -> MetricConfig:
        """Return the ``metric.*`` settings."""
        return self._config

    def stats(self) -> MetricStats:
        """Return the statistics as of the last batch (never blocks; safe from any thread)."""
        return self._stats

    @property
    def pending_stamps(self) -> tuple[int, ...]:
        """Return the stamps of the depth held for frames not predicted yet, oldest first."""
        return tuple(self._pending)

    def scale(self) -> float | None:
        """Return the current session's metres per model unit, None while there is none."""
        if not self._samples:
            return None
        values, weights = zip(*sorted(self._samples))
        half = 0.5 * sum(weights)
        cumulative = np.cumsum(weights)
        return math.exp(values[int(np.searchsorted(cumulative, half))])

    def provide_depth(self, stamp_ns: int, depth_m: np.ndarray) -> None:
        """Hand over the sensor depth of the frame about to be fed (ignored when off).

        Args:
            stamp_ns: the colour frame's stamp.
            depth_m: ``[H0, W0]`` metres, aligned to the colour image (0 or NaN: no value).
        """
        if not self.enabled:
            return
        self._pending[int(stamp_ns)] = depth_m
        self._pending.move_to_end(int(stamp_ns))
        while len(self._pending) > 1 and (
                len(self._pending) > self._max_pending
                or sum(d.nbytes for d in self._pending.values()) > MAX_PENDING_BYTES):
            self._pending.popitem(last=False)  # its frame then counts as without depth

    def observe(self, preds: list[FramePrediction]) -> None:
        """Take one batch of session predictions, before they are stitched.

        Args:
            preds: what the session returned for one call, in order.
        """
        if not self.enabled or not preds:
            return
        sensors = []
        for pred in preds:
            sensor = self._take(pred)
            if pred.is_keyframe:
                self._ring.append(sensor)
                sensors.append(sensor)
        self._update([p for p in preds if p.is_keyframe], sensors)

    def overlap(self) -> list[np.ndarray | None]:
        """Return the sensor depths of the last overlap keyframes (a rollover freezes them)."""
        return list(self._ring)

    def start_session(self, preds: list[FramePrediction], reference_c2w: np.ndarray,
                      session_c2w: np.ndarray, fit: Sim3Alignment,
                      overlap: list[np.ndarray | None] | None = None) -> None:
        """Begin the session a rollover started on the overlap keyframes.

        Args:
            preds: the new session's predictions of the overlap keyframes, in ring order.
            reference_c2w: their published (continuous) poses.
            session_c2w: their poses in the new session.
            fit: the rollover's own alignment (Sim(3) or depth-ratio scale).
            overlap: their sensor depths, as :meth:`overlap` gave them when the overlap was
                frozen; default the last ones.
        """
        if not self.enabled:
            return
        self._new_session()
        self._anchor = (fit, reference_c2w, session_c2w)
        self._sim3_scale = fit.scale
        self._update(preds, (self.overlap() if overlap is None else overlap)[-len(preds):])

    def alignment(self, fallback: Sim3Alignment | None) -> Sim3Alignment | None:
        """Return the session -> continuous mapping to use (``fallback`` without a scale)."""
        scale = self.scale() if self.enabled else None
        if scale is None:
            return fallback
        if self._mapping is None or self._mapping[0] != scale:
            self._mapping = (scale, at_scale(self._anchor, scale))
        return self._mapping[1]

    def reset(self) -> None:
        """Forget the sessions (a new origin); depths of frames not fed yet are kept."""
        self._ring.clear()
        self._new_session()
        self._anchor = None
        self._sim3_scale = None
        self._snapshot()

    def _new_session(self) -> None:
        self._samples = []
        self._keyframes = 0
        self._locked = False
        self._last = None
        self._mapping = None

    def _take(self, pred: FramePrediction) -> np.ndarray | None:
        """Pop the frame's sensor depth (and any older one, which no frame will use)."""
        while self._pending and next(iter(self._pending)) < pred.stamp_ns:
            self._pending.popitem(last=False)
        raw = self._pending.pop(pred.stamp_ns, None)
        sensor = None
        if raw is not None:
            try:
                sensor = to_processed(raw, pred.preprocess, self._config.max_range_m)
            except InvalidFrameError:
                sensor = None  # the caller checks the size; a mismatch here counts as none
        self._counts['with' if sensor is not None else 'without'] += 1
        return sensor

    def _update(self, keyframes: list[FramePrediction], sensors: list[np.ndarray | None]
                ) -> None:
        """One sample from a batch of keyframes (while not locked); settle; snapshot."""
        if not self._locked:
            usable = [(p, s) for p, s in zip(keyframes, sensors)
                      if s is not None and p.depth is not None and p.depth.shape == s.shape]
            if usable:
                # One host copy per batch of keyframes, only until the scale is locked.
                conf = [p.depth_conf for p, _ in usable]
                estimate = estimate_scale(
                    host_maps([p.depth for p, _ in usable]), np.stack([s for _, s in usable]),
                    confidence=host_maps(conf) if all(c is not None for c in conf) else None,
                    min_valid_fraction=self._config.min_valid_fraction,
                    max_range_m=self._config.max_range_m or None)
                self._last = estimate
                if not estimate.degenerate:
                    self._samples.append((math.log(estimate.scale), len(usable)))
                elif estimate.implausible:
                    _log.warning(f'metric scale refused: {estimate.reason} (sensor depth or '
                                 'model broken?); not applied')
            self._keyframes += len(keyframes)
            if self._keyframes >= self._config.settle_keyframes:
                self._locked = True
                self._counts['degenerate'] += int(not self._samples)
        else:
            self._keyframes += len(keyframes)
        self._snapshot()

    def _state(self) -> MetricState:
        if not self.enabled:
            return 'off'
        if self._samples:
            return 'locked' if self._locked else 'settling'
        if self._locked or (self._last is not None and self._last.implausible):
            return 'degenerate'
        return 'waiting'

    def _snapshot(self) -> None:
        last = self._last
        self._stats = MetricStats(
            state=self._state(), scale=self.scale() if self.enabled else None,
            valid_fraction=None if last is None else last.valid_fraction,
            inlier_fraction=None if last is None else last.inlier_fraction,
            spread=None if last is None or last.degenerate else last.spread,
            session_keyframes=self._keyframes, frames_with_depth=self._counts['with'],
            frames_without_depth=self._counts['without'], sim3_scale=self._sim3_scale,
            degenerate_sessions=self._counts['degenerate'],
            reason='' if last is None else last.reason)
