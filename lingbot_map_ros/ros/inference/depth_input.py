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
"""Depth images for the metric scale: pairing with colour frames, every drop counted.

With ``metric.source: depth`` the node subscribes ``depth`` (``sensor_msgs/Image``, aligned to
the colour image) and the offline replay reads ``--depth-topic``; both go through
:class:`DepthInput`, so they pair and drop alike. Nothing here imports rclpy: message fields
are read by name, as in :mod:`~lingbot_map_ros.ros.messages.conversions`.

- **Encodings** (REP 118, :mod:`~lingbot_map_ros.ros.messages.depth_decode`): ``16UC1`` /
  ``mono16`` in millimetres, ``32FC1`` in metres; a message that does not convert is a drop.
- **Pairing**: a colour frame takes the buffered depth image nearest to its stamp within
  ``metric.max_dt_s``. When none is there yet and the depth stream is live (the last depth
  image that could pair arrived in the last second and is stamped within a second of the
  frame, or before the first depth message a publisher on the topic), the worker waits up to
  ``metric.depth_wait_s`` for it; it stops waiting as soon as a depth image up to
  :data:`FUTURE_S` after the frame is buffered (the stream has passed it). A depth stream whose
  images are all dropped (stale, far ahead, broken) is not live, so colour frames do not wait
  for it. A colour frame without depth is processed as usual (the metric layer counts it).
- **No single message poisons the pairing**: a depth image stamped more than :data:`FUTURE_S`
  ahead of the newest colour frame is dropped on arrival; one that came before any colour frame
  is dropped by the first colour frame it is that far ahead of. Neither counts as the stream
  passing a frame, nor keeps the stream live.
- **Every depth image ends paired or dropped with one counted reason**
  (:data:`DEPTH_DROP_REASONS`): a bad encoding, size, step or length (``depth_encoding``,
  ``depth_size``), an invalid stamp, no valid pixel (``depth_no_valid_pixels``: all 0, NaN,
  Inf or out of range), a stamp older than the last processed colour frame
  (``depth_stamp_stale``: nothing can pair with it), a stamp too far ahead
  (``depth_stamp_future``), and a depth image that left the buffer unpaired
  (``depth_unpaired``: pushed out of the full buffer, by count or by bytes,
  :data:`MAX_BUFFER_BYTES`, or passed by the colour frames without a pair, e.g. its colour
  frame was never processed because the live queue keeps only the newest).
  ``received_total == paired_total + drops_total + buffered``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from lingbot_map_ros.config import MetricConfig
from lingbot_map_ros.engine.session.reasons import DEPTH_DROPS
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.messages.depth_decode import depth_msg_to_metres, DepthConversionError
import numpy as np

DEPTH_DROP_REASONS: tuple[str, ...] = tuple(reason.value for reason in DEPTH_DROPS)
"""Every reason a depth image is dropped for (drop-counter keys of the ``input`` status)."""

FUTURE_S = 5.0
"""A depth stamp this far ahead of the newest colour frame received cannot be its pair."""
ALIVE_S = 1.0
"""The depth stream is live when a depth image that could pair came within this many seconds."""
MAX_BUFFER_BYTES = 256 * 1024 * 1024
"""The depth buffer's bound in bytes (besides its count): about 8 images of 3840x2160."""
_LOG_EVERY_S = 5.0


class DepthInput:
    """A bounded, thread-safe buffer of depth images, paired with colour frames by stamp."""

    def __init__(self, config: MetricConfig, capacity: int,
                 count_drop: Callable[[str, str], None], warn: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic,
                 max_bytes: int = MAX_BUFFER_BYTES,
                 condition: threading.Condition | None = None) -> None:
        """Create an empty buffer.

        Args:
            config: ``metric.max_dt_s``, ``metric.depth_wait_s`` and ``metric.max_range_m``.
            capacity: depth images held at most (at least the colour frames that may wait).
            count_drop: ``(reason, detail)`` -> count one dropped depth image.
            warn: logs a line (throttled here, per reason).
            clock: monotonic seconds (tests may replace it).
            max_bytes: bytes of depth held at most (the newest image is always kept).
            condition: guards the buffer and wakes a waiting frame (tests pass one whose
                ``wait`` moves their clock); default: a new ``threading.Condition``.
        """
        self._max_dt_ns = int(round(config.max_dt_s * 1e9))
        self._future_ns = int(FUTURE_S * 1e9)
        self._wait_s = config.depth_wait_s
        self._max_range_m = config.max_range_m
        self._capacity = max(1, int(capacity))
        self._max_bytes = int(max_bytes)
        self._count_drop = count_drop
        self._warn = warn
        self._clock = clock
        self._cond = condition if condition is not None else threading.Condition()
        self._buffer: dict[int, np.ndarray] = {}
        self._bytes = 0
        self._newest_colour_ns: int | None = None
        self._processed_ns: int | None = None
        self._last_arrival = -np.inf
        self._last_arrival_ns = 0
        self._refused_on_arrival = 0
        self._drops = 0
        self._received = 0
        self._paired = 0
        self._logged: dict[str, float] = {}
        self.has_source: Callable[[], bool] = lambda: False
        """Whether a depth publisher exists (the node sets it); read before the first image."""

    @property
    def max_bytes(self) -> int:
        """Bytes of depth held at most (the newest image is always kept)."""
        return self._max_bytes

    @property
    def drops_total(self) -> int:
        """Depth images dropped since start (all reasons)."""
        return self._drops

    @property
    def received_total(self) -> int:
        """Depth messages taken since start (dropped ones included)."""
        return self._received

    @property
    def paired_total(self) -> int:
        """Depth images handed to a colour frame since start."""
        return self._paired

    @property
    def buffered(self) -> int:
        """Depth images waiting for their colour frame now."""
        with self._cond:
            return len(self._buffer)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the depth images waiting now."""
        with self._cond:
            return self._bytes

    def note_colour(self, stamp: Any) -> None:
        """Record the stamp of a colour frame just received (for the future-stamp check)."""
        try:
            stamp_ns = conversions.stamp_to_ns(stamp)
        except conversions.InvalidStampError:
            return  # the colour path drops and counts it
        with self._cond:
            if self._newest_colour_ns is None or stamp_ns > self._newest_colour_ns:
                self._newest_colour_ns = stamp_ns

    def put(self, msg: Any) -> None:
        """Take one depth message (subscription callback or replay); never raises."""
        with self._cond:
            self._received += 1
        try:
            stamp_ns = conversions.stamp_to_ns(msg.header.stamp)
        except conversions.InvalidStampError as exc:
            self._drop('depth_stamp_invalid', str(exc))
            return
        try:
            depth = depth_msg_to_metres(msg, self._max_range_m)
        except DepthConversionError as exc:
            with self._cond:
                self._refused_on_arrival += 1
            self._drop(exc.reason, str(exc))
            return
        with self._cond:
            problem = self._refusal(stamp_ns)
            evicted = []
            if problem is None:
                self._last_arrival, self._last_arrival_ns = self._clock(), stamp_ns
                old = self._buffer.pop(stamp_ns, None)
                if old is not None:  # the same stamp again: the newer image replaces it
                    self._bytes -= old.nbytes
                    evicted.append((stamp_ns, 'the same stamp came again'))
                self._buffer[stamp_ns] = depth
                self._bytes += depth.nbytes
                evicted += self._evict_over_bounds()
                self._cond.notify_all()
        if problem is not None:
            with self._cond:
                self._refused_on_arrival += 1
            self._drop(*problem)
        for stamp, why in evicted:
            self._drop('depth_unpaired', f'depth stamp {stamp * 1e-9:.6f} s left the buffer '
                       f'without a colour frame: {why}')

    def _refusal(self, stamp_ns: int) -> tuple[str, str] | None:
        """Return why a depth image at ``stamp_ns`` cannot pair (hold the lock), or None."""
        if self._processed_ns is not None and stamp_ns < self._processed_ns - self._max_dt_ns:
            stale = (self._processed_ns - stamp_ns) * 1e-9
            return ('depth_stamp_stale', f'depth stamp {stamp_ns * 1e-9:.6f} s is {stale:.3f} '
                    's older than the last colour frame processed')
        if self._newest_colour_ns is not None and \
                stamp_ns > self._newest_colour_ns + self._future_ns:
            ahead = (stamp_ns - self._newest_colour_ns) * 1e-9
            return ('depth_stamp_future', f'depth stamp {stamp_ns * 1e-9:.6f} s is '
                    f'{ahead:.3f} s ahead of the newest colour frame')
        return None

    def _evict_over_bounds(self) -> list[tuple[int, str]]:
        """Drop the oldest images beyond the count or byte bound (hold the lock)."""
        evicted = []
        while len(self._buffer) > 1 and (len(self._buffer) > self._capacity
                                         or self._bytes > self._max_bytes):
            oldest = min(self._buffer)
            self._bytes -= self._buffer.pop(oldest).nbytes
            evicted.append((oldest, f'the buffer is full ({self._capacity} images, '
                            f'{self._max_bytes / 2**20:.0f} MiB)'))
        return evicted

    def take(self, stamp_ns: int, size_hw: tuple[int, int], wait: bool = True
             ) -> np.ndarray | None:
        """Return the depth image paired with the colour frame ``stamp_ns`` (worker thread).

        Args:
            stamp_ns: the colour frame's stamp; frames come in stamp order.
            size_hw: the colour image's (H, W); a depth of another size is dropped.
            wait: wait up to ``metric.depth_wait_s`` while the stream is live and the pair
                may still come.

        Returns:
            ``[H, W]`` float32 metres, or None when no depth pairs with the frame.
        """
        deadline = self._clock() + (self._wait_s if wait else 0.0)
        dropped: list[tuple[str, str]] = []
        depth = None
        with self._cond:
            self._processed_ns = stamp_ns
            while True:
                dropped += self._passed_by(stamp_ns)
                near = [s for s in self._buffer if abs(s - stamp_ns) <= self._max_dt_ns]
                if near:
                    depth = self._buffer.pop(min(near, key=lambda s: abs(s - stamp_ns)))
                    self._bytes -= depth.nbytes
                    break
                if not self._may_come(stamp_ns, deadline):
                    break
                self._cond.wait(max(0.0, deadline - self._clock()))
        for problem in dropped:
            self._drop(*problem)
        if depth is None:
            return None
        if depth.shape != tuple(size_hw):
            self._drop('depth_size', f'depth image {depth.shape[1]}x{depth.shape[0]} is not '
                       f'the colour image size {size_hw[1]}x{size_hw[0]} (W x H): it must be '
                       'aligned to it')
            return None
        with self._cond:
            self._paired += 1
        return depth

    def _passed_by(self, stamp_ns: int) -> list[tuple[str, str]]:
        """Remove the images no frame from ``stamp_ns`` on can pair with (hold the lock).

        Older ones: their colour frames never came (or were not processed). Those more than
        :data:`FUTURE_S` ahead came before any colour frame told they were that far ahead.
        """
        out = []
        for stamp in [s for s in self._buffer if s < stamp_ns - self._max_dt_ns]:
            self._bytes -= self._buffer.pop(stamp).nbytes
            out.append(('depth_unpaired', f'depth stamp {stamp * 1e-9:.6f} s: no colour frame '
                        'within metric.max_dt_s was processed'))
        for stamp in [s for s in self._buffer if s > stamp_ns + self._future_ns]:
            self._bytes -= self._buffer.pop(stamp).nbytes
            if stamp == self._last_arrival_ns:  # it never made the stream live
                self._last_arrival = -np.inf
            out.append(('depth_stamp_future', f'depth stamp {stamp * 1e-9:.6f} s is '
                        f'{(stamp - stamp_ns) * 1e-9:.3f} s ahead of the colour frame'))
        return out

    def _may_come(self, stamp_ns: int, deadline: float) -> bool:
        """Return True while the pair of ``stamp_ns`` may still come (hold the lock)."""
        now = self._clock()
        if now >= deadline:
            return False
        if any(s > stamp_ns + self._max_dt_ns for s in self._buffer):
            return False  # the stream has passed this frame (nothing far ahead is left)
        if self._last_arrival == -np.inf and self._refused_on_arrival == 0:
            return self.has_source()  # before the first depth image: a publisher is there
        return now - self._last_arrival < ALIVE_S and \
            abs(stamp_ns - self._last_arrival_ns) <= ALIVE_S * 1e9

    def pair(self, stamp_ns: int, size_hw: tuple[int, int], metric: Any, wait: bool = True
             ) -> None:
        """Hand the colour frame's depth (if any) to the session's metric layer.

        Args:
            stamp_ns: the colour frame's stamp, before it is fed.
            size_hw: the colour image's (H, W).
            metric: the ``RolloverSession.metric`` (``provide_depth``).
            wait: as :meth:`take`.
        """
        depth = self.take(stamp_ns, size_hw, wait)
        if depth is not None:
            metric.provide_depth(stamp_ns, depth)

    def _drop(self, reason: str, detail: str) -> None:
        with self._cond:
            self._drops += 1
        self._count_drop(reason, detail)
        now = self._clock()
        if now - self._logged.get(reason, -np.inf) >= _LOG_EVERY_S:
            self._logged[reason] = now
            self._warn(f'dropped depth image ({reason}): {detail}')


def from_values(values: dict[str, Any], stats: Any, logger: Any) -> DepthInput | None:
    """Build the node's depth input from its parameters; None unless ``metric.source: depth``.

    The buffer holds every depth image the waiting colour frames may need: the frame queue
    and the subscription's history, plus a few.

    Args:
        values: the node's parameter values.
        stats: the node's ``NodeStats`` (drops are counted there, by reason).
        logger: the node's logger.
    """
    metric = MetricConfig.from_flat(values)
    if not metric.enabled:
        return None
    queued = values['input.queue_size'] if values['input.queue_mode'] == 'bag' else 1
    return DepthInput(metric, queued + values['input.qos.depth'] + 8, stats.count_drop,
                      logger.warning)


def subscribe(node: Any, depth: DepthInput | None, qos: Any) -> list[Any]:
    """Subscribe ``depth`` (remappable) for ``depth``; [] when it is None.

    Its own callback group: in bag mode the image callback blocks while the frame queue is
    full, and the depth images the queued frames wait for must still come in.
    """
    if depth is None:
        return []
    from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
    from sensor_msgs.msg import Image

    sub = node.create_subscription(Image, 'depth', depth.put, qos,
                                   callback_group=MutuallyExclusiveCallbackGroup())
    depth.has_source = lambda: sub.get_publisher_count() > 0
    return [sub]
