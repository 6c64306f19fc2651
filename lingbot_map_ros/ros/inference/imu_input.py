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
"""The IMU input: ``sensor_msgs/Imu`` readings into the checked buffer, every drop counted.

With ``input.imu_topic`` set the node subscribes it with the sensor-data QoS (best effort, a
short history: a late reading is worth less than the next one) and the offline replay reads the
same topic from the bag; both go through :class:`ImuInput`. Nothing here imports rclpy at module
level: message fields are read by name, as :mod:`~lingbot_map_ros.ros.messages.conversions` does.

- **Conversion** (REP 145): ``angular_velocity`` in rad/s and ``linear_acceleration`` in m/s^2
  (specific force: +9.81 up at rest), both in ``header.frame_id``; a covariance whose first
  element is -1 says the field was not measured: such a message is a ``bad_message`` drop.
- **Frame**: every reading must carry ``imu.frame_id`` (or, when empty, the first message's
  frame); another frame is a ``wrong_frame`` drop (two IMUs on one topic, a remapping slip).
- **Stamps**: moved to the camera's clock by ``imu.time_offset_s``; a zero stamp is a
  ``bad_message``; out of order and too far in the future (past the newest image, or the
  clock before any image) are dropped by the buffer (:mod:`~lingbot_map_ros.engine.imu.samples`).
- **Every drop is logged** (a WARN per reason, at most every few seconds) and counted in the
  ``imu`` diagnostics status; the colour path never waits for the IMU.
- **A stream that cannot feed the fusion** is noticed at each colour image
  (:meth:`ImuInput.note_image`): no reading for a while (never started while images arrive, or
  stopped: ``silent``) or fewer than ``min_rate_hz`` (a 5 Hz IMU: ``slow``). Entering such a
  state pauses the fusion, counts a pause (``stream.pauses`` of the status) and logs one WARN
  (at most one per state every :data:`PAUSE_LOG_EVERY_S`); the stream's return to ``ok`` logs an
  INFO. Nothing is logged per frame.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from lingbot_map_ros.config import ImuConfig
from lingbot_map_ros.engine.imu import ImuBuffer
import numpy as np

_LOG_EVERY_S = 5.0
PAUSE_LOG_EVERY_S = 30.0
"""At most one WARN per paused state (and one INFO on recovery) in this many seconds."""
_PAUSED = ('slow', 'silent')
_RATE_SPAN_S = 1.0
"""The buffer's rate is taken over this span: a stream (re)started more recently has none yet."""


def silent_after_s(config: ImuConfig) -> float:
    """Return how long without a reading makes the stream silent (the buffer's rule)."""
    return max(1.0, 20.0 * config.max_gap_s)


def _stamp_s(msg: Any) -> float:
    """Return ``header.stamp`` in seconds."""
    return float(msg.header.stamp.sec) + 1e-9 * float(msg.header.stamp.nanosec)


def _vector(v: Any) -> np.ndarray:
    """Return a geometry_msgs/Vector3 as a [3] float64 array."""
    return np.array([v.x, v.y, v.z], dtype=np.float64)


class ImuInput:
    """The node's IMU readings: conversion, frame and stamp checks, drops counted and logged."""

    def __init__(self, config: ImuConfig, warn: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], float | None] = lambda: None,
                 info: Callable[[str], None] | None = None) -> None:
        """Create an empty input.

        Args:
            config: the ``imu.*`` settings.
            warn: logs a warning (the node's logger).
            clock: monotonic seconds, for throttling the warnings.
            now: the camera clock's present time in seconds (the node's ROS clock), the
                future-stamp reference before any image; None when unknown.
            info: logs an information line (the stream's recovery); None: the recovery is
                not logged.
        """
        self.config = config
        self.buffer = ImuBuffer(config)
        self._warn = warn
        self._info = info
        self._clock = clock
        self._now = now
        self._lock = threading.Lock()
        self._frame_id = config.frame_id
        self._newest_image_s: float | None = None
        self._first_image_s: float | None = None
        self._warned_at: dict[str, float] = {}
        self.received = 0
        """Messages received (kept + every drop)."""
        self._state = 'waiting'
        self._restarted_s: float | None = None
        self._state_at: float | None = None
        self._restart_pending = True
        self.pauses = 0
        """Times the stream went from usable (or not yet started) to ``slow`` or ``silent``."""

    @property
    def frame_id(self) -> str:
        """Frame the readings carry ('' before the first message when none was configured)."""
        return self._frame_id

    def note_image(self, stamp_s: float) -> None:
        """Record a colour image's stamp (camera clock) and take the stream's state at it.

        The stamp is the reference for future stamps; the state change, if any, is logged
        (module docstring).
        """
        with self._lock:
            if self._first_image_s is None or stamp_s < self._first_image_s:
                self._first_image_s = stamp_s
            if self._newest_image_s is None or stamp_s > self._newest_image_s:
                self._newest_image_s = stamp_s
            self._update_state(self._newest_image_s)

    def put(self, msg: Any) -> str | None:
        """Take one ``sensor_msgs/Imu``; return the drop reason, or None when kept."""
        with self._lock:
            self.received += 1
            reason, detail = self._take(msg)
            if reason is not None:
                self._warn_throttled(reason, f'IMU reading dropped ({reason}): {detail}; '
                                             f'{self.buffer.drops[reason]} so far')
            return reason

    def _take(self, msg: Any) -> tuple[str | None, str]:
        """Convert and buffer one message; return ``(reason, detail)`` of a drop."""
        try:
            frame = str(msg.header.frame_id)
            stamp = _stamp_s(msg)
            gyro = _vector(msg.angular_velocity)
            accel = _vector(msg.linear_acceleration)
            unmeasured = (float(msg.angular_velocity_covariance[0]) == -1.0
                          or float(msg.linear_acceleration_covariance[0]) == -1.0)
        except (AttributeError, TypeError, ValueError, IndexError) as exc:
            self.buffer.drop('bad_message')
            return 'bad_message', f'not a sensor_msgs/Imu ({exc})'
        if unmeasured:
            self.buffer.drop('bad_message')
            return 'bad_message', 'angular velocity or acceleration marked not measured'
        if stamp == 0.0:
            self.buffer.drop('bad_message')
            return 'bad_message', 'zero stamp'
        if not self._frame_id:
            self._frame_id = frame
        elif frame != self._frame_id:
            self.buffer.drop('wrong_frame')
            return 'wrong_frame', f"frame '{frame}', expected '{self._frame_id}'"
        reference = self._newest_image_s
        if reference is None:
            reference = self._now()
        reason = self.buffer.add(stamp, gyro, accel, reference)
        if reason is None:
            if self._restart_pending:  # the first reading, or the first after a silence
                self._restarted_s, self._restart_pending = self.buffer.last_stamp, False
            return None, ''
        return reason, f'stamp {stamp:.6f} s, gyro {gyro.tolist()}, accel {accel.tolist()}'

    def _warn_throttled(self, key: str, line: str) -> None:
        """Log ``line`` unless a line of the same key was logged in the last few seconds."""
        now = self._clock()
        if now - self._warned_at.get(key, -np.inf) >= _LOG_EVERY_S:
            self._warned_at[key] = now
            self._warn(line)

    def state(self, now_s: float) -> str:
        """Return the stream's state at camera-clock ``now_s``; log a change (module docstring).

        'waiting' (no reading yet, images for less than the silence span), 'ok', 'slow' or
        'silent' (:meth:`ImuBuffer.state`; also no reading at all for the silence span since
        the first image): fusion runs only on 'ok'.
        """
        with self._lock:
            return self._update_state(now_s)

    def _update_state(self, now_s: float) -> str:
        """Take the state at ``now_s`` and log entering a paused state or leaving one."""
        state = self.buffer.state(now_s)
        if (state == 'waiting' and self._first_image_s is not None
                and now_s - self._first_image_s > silent_after_s(self.config)):
            state = 'silent'  # images for a while and never a reading: not started
        if self._state_at is not None and now_s < self._state_at:
            # An earlier instant (a keyframe processed after newer images arrived): its state
            # answers the caller, the stream's present state stays the newest one.
            return state
        self._state_at = now_s
        previous = self._state
        if (state == 'slow' and self._restarted_s is not None
                and self.buffer.last_stamp - self._restarted_s < _RATE_SPAN_S):
            # Less than the rate's span since the stream (re)started: its rate is not known yet.
            state = previous if previous in ('waiting', 'silent') else 'waiting'
        if state == 'silent':
            self._restart_pending = True
        self._state = state
        if state == previous:
            return state
        if state in _PAUSED:
            if previous not in _PAUSED:
                self.pauses += 1
            self._log_throttled(self._warn, f'paused:{state}', self._pause_line(state, now_s))
        elif state == 'ok' and previous in _PAUSED and self._info is not None:
            self._log_throttled(self._info, 'resumed',
                                f'IMU ok again ({self.buffer.rate_hz():.1f} Hz): IMU fusion '
                                f'resumed after {self.pauses} pause(s)')
        return state

    def _pause_line(self, state: str, now_s: float) -> str:
        """Return the WARN of entering ``state`` ('slow' or 'silent') at ``now_s``."""
        topic = f"'{self.config.topic}'"
        if state == 'slow':
            cause = (f'{self.buffer.rate_hz():.1f} Hz on {topic}, minimum '
                     f'{self.config.min_rate_hz:g} Hz')
        elif self.buffer.last_stamp is None:
            cause = (f'no reading on {topic} in {now_s - self._first_image_s:.1f} s of images '
                     '(not started? check the topic, the driver and the QoS)')
        else:
            cause = (f'no reading on {topic} for {now_s - self.buffer.last_stamp:.1f} s '
                     '(stopped)')
        return (f'IMU {state}: {cause}; IMU fusion paused, the last scale and gravity are '
                'kept, the colour path goes on')

    def _log_throttled(self, log: Callable[[str], None], key: str, line: str) -> None:
        """Log ``line`` unless a line of ``key`` was logged in :data:`PAUSE_LOG_EVERY_S`."""
        now = self._clock()
        if now - self._warned_at.get(key, -np.inf) >= PAUSE_LOG_EVERY_S:
            self._warned_at[key] = now
            log(line)

    def window(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Return the readings covering ``[t0, t1]`` (camera clock), or None."""
        with self._lock:
            return self.buffer.window(t0, t1)

    def status(self) -> dict[str, Any]:
        """Return the stream's figures for the ``imu`` diagnostics status."""
        with self._lock:
            return {'topic': self.config.topic, 'frame_id': self._frame_id,
                    'received': self.received, 'accepted': self.buffer.accepted,
                    'rate_hz': self.buffer.rate_hz(), 'largest_gap_s': self.buffer.largest_gap_s,
                    'drops': dict(self.buffer.drops), 'state': self._state,
                    'pauses': self.pauses,
                    'time_offset_s': self.config.time_offset_s}


def subscribe(node: Any, imu: ImuInput | None) -> list[Any]:
    """Subscribe ``imu.topic`` with the sensor-data QoS for ``imu``; [] when it is None.

    Its own callback group: readings come at hundreds of hertz and must not queue behind an
    image callback that blocks in bag mode.
    """
    if imu is None:
        return []
    from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Imu

    return [node.create_subscription(Imu, imu.config.topic, imu.put, qos_profile_sensor_data,
                                     callback_group=MutuallyExclusiveCallbackGroup())]
