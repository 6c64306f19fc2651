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
"""The IMU reading buffer: every reading checked, bad ones dropped and counted by reason.

Readings arrive one by one (200 Hz or more) and are kept for ``buffer_s`` seconds, on the
camera's clock (the IMU stamp minus ``time_offset_s``). A reading is dropped, and counted under
its reason, when it has a NaN or infinite value (``non_finite``), is not newer than the last one
kept (``out_of_order``: a duplicate, or a reordered message), is stamped more than
``max_future_s`` past the reference time (``future``), or has a component at 98 % of the
sensor's full scale (``saturated``: the true value is unknown, so it cannot be integrated).
The ROS layer counts its own drops (``wrong_frame``, ``bad_message``) here too, so one table
holds them all. :meth:`ImuBuffer.state` tells whether the stream can feed the alignment: an IMU
silent, or slower than ``min_rate_hz``, pauses the fusion instead of giving a scale from gaps.
"""

from __future__ import annotations

from collections import deque

from lingbot_map_ros.imu_config import ImuConfig
import numpy as np

DROP_REASONS: tuple[str, ...] = ('non_finite', 'out_of_order', 'future', 'saturated',
                                 'wrong_frame', 'bad_message')
"""Every reason a reading is dropped for."""
SATURATION_SHARE = 0.98
"""A component at this share of the full scale is taken as clipped."""
_RATE_SPAN_S = 1.0


class ImuBuffer:
    """Checked IMU readings of the last ``buffer_s`` seconds, with drop counters."""

    def __init__(self, config: ImuConfig = ImuConfig()) -> None:
        """Start empty with the checks of ``config``."""
        self._config = config
        self._readings: deque[tuple[float, np.ndarray, np.ndarray]] = deque()
        self.drops: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        """Readings dropped, by reason."""
        self.accepted = 0
        """Readings kept since the start."""
        self.largest_gap_s = 0.0
        """Longest time between two consecutive kept readings since the start, seconds."""

    @property
    def last_stamp(self) -> float | None:
        """Camera-clock stamp of the newest reading kept, seconds (None before any)."""
        return self._readings[-1][0] if self._readings else None

    def __len__(self) -> int:
        """Return the number of readings held."""
        return len(self._readings)

    def drop(self, reason: str) -> None:
        """Count a reading dropped before it reached the buffer (the ROS layer's checks).

        Raises:
            ValueError: an unknown reason.
        """
        if reason not in self.drops:
            raise ValueError(f'unknown IMU drop reason {reason!r}')
        self.drops[reason] += 1

    def add(self, stamp_s: float, gyro: object, accel: object,
            reference_s: float | None = None) -> str | None:
        """Check and keep one reading; return the drop reason, or None when kept.

        Args:
            stamp_s: IMU-clock stamp, seconds (``time_offset_s`` is subtracted here).
            gyro: [3] rad/s.
            accel: [3] m/s^2 specific force.
            reference_s: camera-clock time past which a stamp is in the future (the newest
                image's stamp or the node's clock); None skips the check.
        """
        g = np.asarray(gyro, dtype=np.float64).reshape(-1)
        a = np.asarray(accel, dtype=np.float64).reshape(-1)
        stamp = float(stamp_s) - self._config.time_offset_s
        reason = self._check(stamp, g, a, reference_s)
        if reason is not None:
            self.drops[reason] += 1
            return reason
        if self._readings:
            self.largest_gap_s = max(self.largest_gap_s, stamp - self._readings[-1][0])
        self._readings.append((stamp, g, a))
        self.accepted += 1
        while self._readings and self._readings[0][0] < stamp - self._config.buffer_s:
            self._readings.popleft()
        return None

    def _check(self, stamp: float, gyro: np.ndarray, accel: np.ndarray,
               reference_s: float | None) -> str | None:
        """Return why a reading is dropped, or None."""
        if gyro.shape != (3,) or accel.shape != (3,):
            return 'bad_message'
        if not (np.isfinite(stamp) and np.isfinite(gyro).all() and np.isfinite(accel).all()):
            return 'non_finite'
        if self._readings and stamp <= self._readings[-1][0]:
            return 'out_of_order'
        if reference_s is not None and stamp > reference_s + self._config.max_future_s:
            return 'future'
        cfg = self._config
        if ((cfg.gyro_range > 0.0 and np.abs(gyro).max() >= SATURATION_SHARE * cfg.gyro_range)
                or (cfg.accel_range > 0.0
                    and np.abs(accel).max() >= SATURATION_SHARE * cfg.accel_range)):
            return 'saturated'
        return None

    def rate_hz(self) -> float:
        """Return the reading rate over the last second of readings (0 with fewer than 2)."""
        if len(self._readings) < 2:
            return 0.0
        newest = self._readings[-1][0]
        count = 0
        oldest = newest
        for stamp, _, _ in reversed(self._readings):
            if stamp < newest - _RATE_SPAN_S:
                break
            oldest = stamp
            count += 1
        return (count - 1) / (newest - oldest) if newest > oldest else 0.0

    def state(self, now_s: float) -> str:
        """Return the stream's state at camera-clock time ``now_s``.

        'waiting' (no reading yet), 'silent' (none for ``max_gap_s`` * 20, at least a second),
        'slow' (rate below ``min_rate_hz``) or 'ok'.
        """
        last = self.last_stamp
        if last is None:
            return 'waiting'
        if now_s - last > max(1.0, 20.0 * self._config.max_gap_s):
            return 'silent'
        if self.rate_hz() < self._config.min_rate_hz:
            return 'slow'
        return 'ok'

    def window(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Return ``(stamps, gyro, accel)`` of the readings covering ``[t0, t1]`` (camera clock).

        The arrays run from the last reading at or before ``t0`` to the first at or after
        ``t1``; None when the buffer does not reach that far on either side.
        """
        if not self._readings or self._readings[0][0] > t0 or self._readings[-1][0] < t1:
            return None
        # Walked back from the newest reading: the windows asked for (a frame's step, a
        # keyframe interval, an alignment) end near it, so this costs the window, not the
        # buffer (called at every frame).
        chosen: list[tuple[float, np.ndarray, np.ndarray]] = []
        for reading in reversed(self._readings):
            if reading[0] >= t1:
                chosen = [reading]  # the earliest at or after t1 so far
                if reading[0] <= t0:
                    break
                continue
            chosen.append(reading)
            if reading[0] <= t0:
                break
        chosen.reverse()
        return (np.array([r[0] for r in chosen], dtype=np.float64),
                np.stack([r[1] for r in chosen]), np.stack([r[2] for r in chosen]))
