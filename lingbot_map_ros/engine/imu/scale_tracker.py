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
"""ImuScaleTracker: each session's metric scale and gravity from the IMU, with a lock state.

The IMU counterpart of :class:`~lingbot_map_ros.engine.session.metric_session.MetricSession`:
the model's keyframes of the current session (their session poses, in that session's units)
are kept; every ``align_every`` keyframes, once ``window_keyframes`` are there and the IMU
stream is healthy, :func:`~lingbot_map_ros.engine.imu.alignment.align` runs on the last
window. Each ``ok`` alignment is a sample; the session's scale is the median of its samples,
and it locks once ``settle_samples`` samples agree within ``lock_spread``, then is held until
the session ends (a rollover or reset starts over: each session has its own units).

States: ``off`` (no IMU), ``waiting`` (too few keyframes, or the IMU not healthy: the stream
state says which), ``settling`` (samples, not yet agreeing), ``locked`` (held), ``degenerate``
(``degenerate_after`` windows in a row without a sample: constant velocity, pure rotation or a
broken IMU; :attr:`ImuStats.reason` says why). A locked session keeps its scale whatever later
windows say; a degenerate one has none, so the caller keeps the rollover's own mapping (the
last good scale carried on), exactly as without an IMU.

Gravity: every ``ok`` alignment also gives gravity in the session's world frame; the tracker
keeps the latest, and the angle between it and the previous one (the gravity residual of the
diagnostics). Rotated into the continuous frame by the caller it gives the z-up ``odom``
(:func:`~lingbot_map_ros.engine.imu.gravity.aligned_from_world`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
import math
from typing import Callable, Literal

from lingbot_map_ros.engine.imu import so3
from lingbot_map_ros.engine.imu.alignment import align, Alignment, AlignmentOptions
import numpy as np

ImuScaleState = Literal['off', 'waiting', 'settling', 'locked', 'degenerate']
ImuWindow = Callable[[float, float], 'tuple[np.ndarray, np.ndarray, np.ndarray] | None']


@dataclass(frozen=True)
class TrackerConfig:
    """How often and over how much the tracker aligns."""

    window_keyframes: int = 10
    """Keyframes of one alignment window (``min_spacing_s`` apart: about four seconds)."""
    min_spacing_s: float = 0.4
    """Seconds between the keyframes the tracker keeps (closer ones are skipped): the model's
    position noise enters the alignment divided by the spacing squared, so close keyframes
    bias the scale low (errors in variables)."""
    align_every: int = 2
    """Kept keyframes between alignments."""
    settle_samples: int = 3
    """Samples that must agree before the scale locks."""
    lock_spread: float = 0.03
    """Largest relative spread (max / min - 1) of those samples for the lock."""
    degenerate_after: int = 6
    """Windows in a row without a sample before the session is called degenerate."""

    def __post_init__(self) -> None:
        """Reject out-of-range values."""
        if self.window_keyframes < 3:
            raise ValueError('window_keyframes must be >= 3')
        if min(self.align_every, self.settle_samples, self.degenerate_after) < 1:
            raise ValueError('align_every, settle_samples and degenerate_after must be >= 1')
        if not self.lock_spread > 0.0:
            raise ValueError('lock_spread must be > 0')
        if not (math.isfinite(self.min_spacing_s) and self.min_spacing_s >= 0.0):
            raise ValueError('min_spacing_s must be a finite number >= 0')


@dataclass(frozen=True)
class ImuStats:
    """What the IMU scale layer reports (None: not known yet)."""

    state: ImuScaleState = 'off'
    """'off', 'waiting', 'settling', 'locked' or 'degenerate' (module docstring)."""
    scale: float | None = None
    """Metres per model unit of the current session."""
    gravity: np.ndarray | None = None
    """[3] unit gravity direction in the current session's world frame."""
    gyro_bias: np.ndarray | None = None
    """[3] rad/s, the last alignment's."""
    accel_bias: np.ndarray | None = None
    """[3] m/s^2, the last ok alignment's."""
    gravity_residual_deg: float | None = None
    """Angle between the last two ok gravity estimates, degrees."""
    scale_rel_std: float | None = None
    """The last alignment's relative standard error of the scale."""
    samples: int = 0
    """Ok alignments of the current session."""
    windows: int = 0
    """Alignments tried in the current session."""
    session_keyframes: int = 0
    """Keyframes seen in the current session."""
    degenerate_sessions: int = 0
    """Sessions that ended (or are) degenerate since the start."""
    reason: str = ''
    """Why the last alignment gave no sample ('' when it did)."""


class ImuScaleTracker:
    """Per-session metric scale and gravity from the IMU (module docstring)."""

    def __init__(self, window: ImuWindow | None, config: TrackerConfig = TrackerConfig(),
                 options: AlignmentOptions = AlignmentOptions(),
                 imu_from_camera: np.ndarray | None = None,
                 healthy: Callable[[float], bool] = lambda t: True) -> None:
        """Start in ``waiting`` (``off`` when ``window`` is None).

        Args:
            window: ``(t0, t1) -> (stamps, gyro, accel)`` of the readings covering an
                interval on the camera clock, or None (the IMU input's ``window``).
            config: the tracker's window and lock settings.
            options: the alignment's thresholds.
            imu_from_camera: [4, 4] mounting (None: identity).
            healthy: ``t -> bool``, whether the IMU stream is usable at camera time ``t``.
        """
        self._window = window
        self._config = config
        self._options = options
        self._mount = imu_from_camera
        self._healthy = healthy
        self._keyframes: collections.deque[tuple[float, np.ndarray]] = collections.deque(
            maxlen=config.window_keyframes)
        self._degenerate_sessions = 0
        self._gravity: np.ndarray | None = None
        self._gravity_residual: float | None = None
        self._last: Alignment | None = None
        self._new_session()

    @property
    def enabled(self) -> bool:
        """Return True when an IMU feeds the tracker."""
        return self._window is not None

    def _new_session(self) -> None:
        self._keyframes.clear()
        self._samples: list[float] = []
        self._locked_scale: float | None = None
        self._since_align = 0
        self._misses = 0
        self._windows = 0
        self._session_keyframes = 0
        self._counted_degenerate = False
        self._reason = ''

    def start_session(self) -> None:
        """Begin a new session (a rollover): its keyframes are in new units."""
        self._new_session()

    def reset(self) -> None:
        """Forget everything (a new origin); gravity is re-estimated too."""
        self._new_session()
        self._gravity = None
        self._gravity_residual = None
        self._last = None

    def scale(self) -> float | None:
        """Return the current session's metres per model unit, None while there is none."""
        if self._locked_scale is not None:
            return self._locked_scale
        return float(np.median(self._samples)) if self._samples else None

    def gravity(self) -> np.ndarray | None:
        """Return the latest gravity direction in the current session's world frame."""
        return self._gravity

    def add_keyframe(self, stamp_s: float, c2w: np.ndarray) -> Alignment | None:
        """Take one keyframe (camera clock, session pose); return the alignment if one ran."""
        if not self.enabled:
            return None
        if self._keyframes and stamp_s <= self._keyframes[-1][0]:
            return None  # a keyframe given twice (overlap) or out of order adds nothing
        self._session_keyframes += 1
        # A microsecond of slack: stamps of a steady frame rate are not exact in float.
        if (self._keyframes
                and stamp_s - self._keyframes[-1][0] < self._config.min_spacing_s - 1e-6):
            return None
        self._keyframes.append((float(stamp_s), np.asarray(c2w, dtype=np.float64)))
        self._since_align += 1
        if (len(self._keyframes) < self._config.window_keyframes
                or self._since_align < self._config.align_every
                or self._locked_scale is not None):
            return None
        self._since_align = 0
        return self._align()

    def _align(self) -> Alignment | None:
        """Run one alignment over the window; take it as a sample when ok."""
        stamps = np.array([k[0] for k in self._keyframes])
        # An IMU that is not there pauses the tracker ('waiting'); only motion is degenerate.
        if not self._healthy(float(stamps[-1])):
            self._reason = 'IMU stream not healthy (silent, slow or not started): paused'
            return None
        readings = self._window(float(stamps[0]), float(stamps[-1]))
        if readings is None:
            self._reason = 'IMU readings do not cover the window (late start or stopped): paused'
            return None
        poses = np.stack([k[1] for k in self._keyframes])
        try:
            result = align(poses, stamps, *readings, self._mount, self._options)
        except ValueError as exc:
            self._miss(f'alignment refused the window: {exc}')
            return None
        self._windows += 1
        self._last = result
        if not result.ok:
            self._miss(result.reason)
            return result
        self._misses = 0
        self._reason = ''
        self._samples.append(result.scale)
        if self._gravity is not None:
            self._gravity_residual = math.degrees(so3.angle_between(result.gravity,
                                                                    self._gravity))
        self._gravity = result.gravity
        recent = self._samples[-self._config.settle_samples:]
        if (len(recent) == self._config.settle_samples
                and max(recent) / min(recent) - 1.0 <= self._config.lock_spread):
            self._locked_scale = float(np.median(recent))
        return result

    def _miss(self, reason: str) -> None:
        self._misses += 1
        self._reason = reason
        if (self._misses >= self._config.degenerate_after and not self._samples
                and not self._counted_degenerate):
            self._counted_degenerate = True
            self._degenerate_sessions += 1

    def state(self) -> ImuScaleState:
        """Return the state: off, waiting, settling, locked or degenerate (module docstring)."""
        if not self.enabled:
            return 'off'
        if self._locked_scale is not None:
            return 'locked'
        if self._samples:
            return 'settling'
        if self._misses >= self._config.degenerate_after:
            return 'degenerate'
        return 'waiting'

    def stats(self) -> ImuStats:
        """Return the statistics of the current session."""
        last = self._last
        return ImuStats(
            state=self.state(), scale=self.scale(), gravity=self._gravity,
            gyro_bias=None if last is None else last.gyro_bias,
            accel_bias=None if last is None or not last.ok else last.accel_bias,
            gravity_residual_deg=self._gravity_residual,
            scale_rel_std=None if last is None else last.scale_rel_std,
            samples=len(self._samples), windows=self._windows,
            session_keyframes=self._session_keyframes,
            degenerate_sessions=self._degenerate_sessions, reason=self._reason)


def scale_disagreement(imu_scale: float | None, depth_scale: float | None) -> float | None:
    """Return ``imu / depth - 1`` of two scale estimates of one session (None if either is)."""
    if imu_scale is None or depth_scale is None or not depth_scale > 0.0:
        return None
    return imu_scale / depth_scale - 1.0
