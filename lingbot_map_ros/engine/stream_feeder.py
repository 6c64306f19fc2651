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
"""StreamFeeder: the one policy for feeding a stream of stamped frames to a StreamingSession.

The node's worker (``ros/session_runner.py``) and the offline replay (``tools/offline.py``)
both feed frames through a :class:`StreamFeeder`, so they drop and reset on the same
conditions, checked in this order:

=======================  ===============================================================
condition                what happens
=======================  ===============================================================
stamp not newer          dropped as ``stamp_out_of_order`` (small step back, duplicate)
stamp jumps back         session reset (``clock_jump``), the frame starts the new map
engine refuses frame     dropped as ``invalid_frame``
non-finite pose          session reset (``nan_pose``), the frame is lost
session limit            session reset (``time_index_limit``, ``cache_full``,
                         ``resolution_changed``), the frame is fed once more
anything else            with ``reset_on_error``: session reset (``engine_error``), the
                         frame is lost; without it the exception propagates
=======================  ===============================================================

"Stamp jumps back" means a step back of at least ``backwards_reset_s``. The feeder only
decides and reports: each :class:`FeedResult` says what happened, and the caller counts, logs
and clears its own outputs. It holds no lock; a caller that resets from another thread
serialises :meth:`StreamFeeder.feed` and :meth:`StreamFeeder.reset` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import errors
from .pipeline import StreamingSession
from .prediction import FramePrediction

_LIMIT_REASONS = ((errors.TimeIndexLimitError, 'time_index_limit'),
                  (errors.CachePoolExhaustedError, 'cache_full'),
                  (errors.ResolutionChangedError, 'resolution_changed'))


@dataclass(frozen=True, slots=True)
class FrameDrop:
    """A frame the session did not take; the session is unchanged."""

    reason: str
    """``stamp_out_of_order`` or ``invalid_frame``."""
    detail: str
    """What was wrong, for logs and diagnostics."""


@dataclass(frozen=True, slots=True)
class SessionReset:
    """A session reset the feeder made; the map starts again."""

    reason: str
    """``clock_jump``, ``nan_pose``, ``time_index_limit``, ``cache_full``,
    ``resolution_changed``, ``session_limit`` (another limit) or ``engine_error``."""
    detail: str
    """Why, for logs and diagnostics."""
    cleared: dict[str, int]
    """What ``StreamingSession.reset()`` cleared."""
    error: Exception | None = None
    """The unexpected exception behind an ``engine_error`` reset, else None."""


@dataclass(frozen=True, slots=True)
class FeedResult:
    """What feeding one frame gave and what happened on the way."""

    predictions: list[FramePrediction]
    """What the session returned for the frame, all from the session after the last reset."""
    resets: tuple[SessionReset, ...] = ()
    """Resets made for this frame, in order (all before ``drop``)."""
    drop: FrameDrop | None = None
    """Why the session did not take the frame, when it was dropped."""
    accepted: bool = False
    """The session took the frame: its prediction is in ``predictions`` or comes later."""


class StreamFeeder:
    """Owns the last accepted stamp and wraps ``StreamingSession.step`` with the policy above."""

    def __init__(self, session: StreamingSession, backwards_reset_s: float = 1.0, *,
                 reset_on_error: bool = False,
                 on_reset: Callable[[], None] | None = None) -> None:
        """Wrap a session.

        Args:
            session: the engine session to feed.
            backwards_reset_s: a stamp at least this many seconds older than the last one
                resets the session; a smaller step back drops the frame. May be changed
                between frames through the attribute of the same name.
            reset_on_error: turn any other exception of ``session.step`` into an
                ``engine_error`` reset (the node, which must keep going) instead of raising.
            on_reset: called right after every session reset, before the frame is fed
                again, for what the new session's first frame must already see.
        """
        self.backwards_reset_s = backwards_reset_s
        self._session = session
        self._reset_on_error = reset_on_error
        self._on_reset = on_reset
        self._last_stamp_ns: int | None = None

    @property
    def last_stamp_ns(self) -> int | None:
        """Stamp of the last frame that passed the stamp check, None after a reset."""
        return self._last_stamp_ns

    def feed(self, image: np.ndarray | str | Path, stamp_ns: int) -> FeedResult:
        """Check the stamp, feed the frame, reset and feed it again where the policy says.

        Args:
            image: as ``StreamingSession.step`` takes it.
            stamp_ns: the frame's timestamp in nanoseconds.

        Returns:
            The predictions and what happened.

        Raises:
            Exception: whatever ``session.step`` raises outside the policy, unless
                ``reset_on_error``.
        """
        resets: list[SessionReset] = []
        drop = self._check_stamp(stamp_ns, resets)
        if drop is not None:
            return FeedResult([], drop=drop)
        for attempt in range(2):
            try:
                preds = self._session.step(image, stamp_ns)
                return FeedResult(preds, tuple(resets), accepted=True)
            except errors.InvalidFrameError as exc:
                return FeedResult([], tuple(resets), FrameDrop('invalid_frame', str(exc)))
            except errors.NonFiniteOutputError as exc:
                # Caught before its base class SessionLimitError: no second try here.
                resets.append(self._reset('nan_pose', str(exc)))
            except errors.SessionLimitError as exc:
                reason = next((r for t, r in _LIMIT_REASONS if isinstance(exc, t)),
                              'session_limit')
                resets.append(self._reset(reason, str(exc)))
                if attempt == 0:
                    # The session was left unchanged, so the frame starts the new one.
                    self._last_stamp_ns = stamp_ns
                    continue
            except Exception as exc:  # noqa: BLE001 - the caller chose to absorb engine bugs
                if not self._reset_on_error:
                    raise
                resets.append(self._reset('engine_error', str(exc), exc))
            break
        return FeedResult([], tuple(resets))

    def reset(self) -> dict[str, int]:
        """Reset the session and forget the last stamp.

        Returns:
            What ``StreamingSession.reset()`` cleared.
        """
        cleared = dict(self._session.reset())
        self._last_stamp_ns = None
        if self._on_reset is not None:
            self._on_reset()
        return cleared

    def _check_stamp(self, stamp_ns: int, resets: list[SessionReset]) -> FrameDrop | None:
        last = self._last_stamp_ns
        if last is None or stamp_ns > last:
            self._last_stamp_ns = stamp_ns
            return None
        back_s = (last - stamp_ns) * 1e-9
        if back_s > 0 and back_s >= self.backwards_reset_s:
            resets.append(self._reset('clock_jump', f'stamp went back {back_s:.3f} s'))
            self._last_stamp_ns = stamp_ns
            return None
        return FrameDrop('stamp_out_of_order', f'stamp {stamp_ns * 1e-9:.6f} s is not after '
                         f'the previous {last * 1e-9:.6f} s')

    def _reset(self, reason: str, detail: str, error: Exception | None = None) -> SessionReset:
        return SessionReset(reason, detail, self.reset(), error)
