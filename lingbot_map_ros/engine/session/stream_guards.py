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
"""Glitch filters of :class:`~lingbot_map_ros.engine.session.stream_feeder.StreamFeeder`.

One bad frame must not cost the map or the frames after it:

- :class:`ForwardJumpGuard`: a frame stamped far ahead of the stream is *held* back (not fed);
  when the next frame comes after it, within the cadence, the jump was real (a gap in the
  stream) and both are fed, in order. Otherwise the held frame was an outlier: it is dropped
  (``stamp_jump_ahead``), never becomes the stamp reference, and the stream goes on. "Far ahead" is
  more than ``max(forward_jump_s, 4 x the median of the last 8 accepted steps)``, so slow
  cameras (1 Hz) are not mistaken for jumps. The first step of a session has no cadence to
  compare with and is always accepted.
- :class:`ResolutionGuard`: a frame the session refuses for its size is dropped
  (``resolution_mismatch``) until ``change_frames`` consecutive frames of the same new input
  size arrived; that one resets the session (``resolution_changed``) and starts the new map.
"""

from __future__ import annotations

import collections
import statistics

_STEP_HISTORY = 8
_JUMP_PERIODS = 4.0


class ForwardJumpGuard:
    """Decides whether a newer stamp is a plausible next frame or possibly an outlier ahead."""

    def __init__(self, forward_jump_s: float = 0.0) -> None:
        """Create the guard.

        Args:
            forward_jump_s: smallest step ahead that is checked; 0 turns the guard off. May be
                changed between frames through the attribute of the same name.
        """
        self.forward_jump_s = forward_jump_s
        self._steps: collections.deque[int] = collections.deque(maxlen=_STEP_HISTORY)

    def clear(self) -> None:
        """Forget the cadence (after a session reset)."""
        self._steps.clear()

    def threshold_ns(self) -> int:
        """Step ahead above which a frame is held, in nanoseconds."""
        floor = int(self.forward_jump_s * 1e9)
        if not self._steps:
            return floor
        return max(floor, int(_JUMP_PERIODS * statistics.median(self._steps)))

    def check(self, last_ns: int, stamp_ns: int) -> str | None:
        """Check a stamp newer than ``last_ns``.

        Returns:
            None when the frame may be fed now (its step joins the cadence), else why it is
            held until the next frame.
        """
        step = stamp_ns - last_ns
        if self.forward_jump_s > 0 and self._steps and step > self.threshold_ns():
            return (f'stamp {stamp_ns * 1e-9:.6f} s is {step * 1e-9:.3f} s after the previous '
                    f'{last_ns * 1e-9:.6f} s (more than {self.threshold_ns() * 1e-9:.3f} s) '
                    'and the next frame did not come after it')
        self._steps.append(step)
        return None

    def confirms(self, held_ns: int, stamp_ns: int) -> bool:
        """Whether a frame stamped ``stamp_ns`` confirms the jump to a held ``held_ns``."""
        step = stamp_ns - held_ns
        return 0 < step <= self.threshold_ns()


class ResolutionGuard:
    """Counts consecutive frames of a new size before a resolution change may reset."""

    def __init__(self, change_frames: int = 1) -> None:
        """Create the guard.

        Args:
            change_frames: consecutive frames of one new size that start a new session (1: the
                first one does). May be changed between frames through the attribute.
        """
        self.change_frames = change_frames
        self._size: tuple[int, ...] | None = None
        self._count = 0

    def clear(self) -> None:
        """Forget the candidate size (a frame of the session's size arrived, or a reset)."""
        self._size, self._count = None, 0

    def observe(self, size: tuple[int, ...] | None) -> bool:
        """Count a frame the session refused for its size.

        Args:
            size: the frame's input size (None when unknown: every such frame counts alike).

        Returns:
            True when the change persisted long enough: reset and feed the frame again.
        """
        if size != self._size:
            self._size, self._count = size, 0
        self._count += 1
        if self._count >= max(1, self.change_frames):
            self.clear()
            return True
        return False

    @property
    def pending(self) -> int:
        """Frames of the candidate size seen so far."""
        return self._count
