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
"""FramePace: a loop check's units spaced out between the frames a stream serves.

A ``pace`` for ``model_verifier.ModelVerifier`` (``loop.verify_unit_interval``): the frame
thread counts served frames, the verifier's worker waits before each unit until enough have
passed, so a check never takes more than its share of the stream.
"""

from __future__ import annotations

import threading


class FramePace:
    """A ``pace`` for :class:`ModelVerifier`: one unit beside at most one frame in N.

    The frame thread calls :meth:`tick` after each frame; the verifier's worker, before each
    unit, waits until N = ``every_n_frames`` frames were served since the previous unit was let
    go (a check's first unit runs at once when that is long past: frames served while no check
    ran buy no burst of units). A unit let go after frame ``f`` runs beside frame ``f + 1``, so
    two units never share a frame and are at least N frames apart: a check's model work costs
    the stream 1/N of a unit per frame and takes N times as many frames. With no frame for
    ``timeout_s`` (a stopped camera) the unit runs anyway, so a check always ends.

    :meth:`take` is the same decision without waiting, for a caller that runs the units in a
    frame's ``overlap`` hook: ``pace.tick(); if pace.take(): verification.step()``.
    """

    def __init__(self, timeout_s: float = 0.5, every_n_frames: int = 1) -> None:
        """Space units ``every_n_frames`` frames apart (>= 1); wait ``timeout_s`` (> 0).

        Raises:
            ValueError: ``timeout_s`` not > 0, or ``every_n_frames`` not an int >= 1.
        """
        if not timeout_s > 0:
            raise ValueError(f'FramePace: timeout_s={timeout_s} must be > 0')
        if isinstance(every_n_frames, bool) or not isinstance(every_n_frames, int) \
                or every_n_frames < 1:
            raise ValueError(f'FramePace: every_n_frames={every_n_frames!r} must be an int '
                             '>= 1')
        self._timeout_s = timeout_s
        self.every_n_frames = every_n_frames
        """Least number of frames from one unit to the next."""
        self._frames = 0
        self._next = 1
        self._cond = threading.Condition()

    @property
    def frames(self) -> int:
        """Frames served so far (ticks)."""
        return self._frames

    @property
    def pending(self) -> bool:
        """Whether the next unit may run now (enough frames since the last one)."""
        return self._frames >= self._next

    def tick(self) -> None:
        """Take note that a frame was served (frame thread; never waits for a unit)."""
        with self._cond:
            self._frames += 1
            self._cond.notify_all()

    def take(self) -> bool:
        """Let a unit go now if it is due (no wait); True when it may run."""
        with self._cond:
            if self._frames < self._next:
                return False
            self._let_go()
            return True

    def __call__(self) -> int:
        """Wait until the next unit is due, or for no frame in ``timeout_s`` (worker).

        Returns:
            The number of frames served when the unit was let go.
        """
        with self._cond:
            while self._frames < self._next:
                if not self._cond.wait(self._timeout_s):
                    break  # no frame within the timeout: the camera stopped
            return self._let_go()

    def _let_go(self) -> int:
        # Counted from now: frames served while no unit waited buy no burst of units later.
        self._next = self._frames + self.every_n_frames
        return self._frames
