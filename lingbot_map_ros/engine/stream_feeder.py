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
stamp far ahead          held; fed before the next frame if that one comes after it,
                         else dropped as ``stamp_jump_ahead``
engine refuses frame     dropped as ``invalid_frame``
new size, not yet seen   dropped as ``resolution_mismatch`` (fewer than
``resolution_change_frames`` consecutive frames of it)
non-finite pose          session reset (``nan_pose``), the frame is lost
session limit            session reset (``time_index_limit``, ``cache_full``,
                         ``resolution_changed``), the frame is fed once more
anything else            with ``reset_on_error``: session reset (``engine_error``), the
                         frame is lost; without it the exception propagates
=======================  ===============================================================

"Stamp jumps back" means a step back of at least ``backwards_reset_s``; "far ahead" and the
resolution-change count are :mod:`~lingbot_map_ros.engine.stream_guards`. The feeder only
decides and reports: each :class:`FeedResult` says what happened, and the caller counts, logs
and clears its own outputs. It holds no lock; a caller that resets from another thread
serialises :meth:`StreamFeeder.feed` and :meth:`StreamFeeder.reset` itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import errors
from .pipeline import StreamingSession
from .prediction import FramePrediction
from .stream_guards import ForwardJumpGuard, ResolutionGuard

_LIMIT_REASONS = ((errors.TimeIndexLimitError, 'time_index_limit'),
                  (errors.CachePoolExhaustedError, 'cache_full'))


@dataclass(frozen=True, slots=True)
class FrameDrop:
    """A frame the session did not take; the session is unchanged."""

    reason: str
    """``stamp_out_of_order``, ``stamp_jump_ahead``, ``resolution_mismatch`` or
    ``invalid_frame``."""
    detail: str
    """What was wrong, for logs and diagnostics."""
    stamp_ns: int | None = None
    """Stamp of the dropped frame (set for a held frame, which was fed in an earlier call)."""


# Reason of _check_stamp's answer for a frame to hold until the next one (never reported).
_HOLD = 'hold'


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
    held: bool = False
    """The frame is held (stamp far ahead): it is fed or dropped with the next call."""
    held_drop: FrameDrop | None = None
    """The frame held by the previous call was dropped (an outlier, or refused when fed)."""


class StreamFeeder:
    """Owns the last accepted stamp and wraps ``StreamingSession.step`` with the policy above."""

    def __init__(self, session: StreamingSession, backwards_reset_s: float = 1.0, *,
                 reset_on_error: bool = False,
                 on_reset: Callable[[], None] | None = None, forward_jump_s: float = 0.0,
                 resolution_change_frames: int = 1) -> None:
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
            forward_jump_s: see :class:`ForwardJumpGuard` (0: off); ``self.jump_guard``.
            resolution_change_frames: see :class:`ResolutionGuard`; ``self.resolution_guard``.
        """
        self.backwards_reset_s = backwards_reset_s
        self._session = session
        self._reset_on_error = reset_on_error
        self._on_reset = on_reset
        self._last_stamp_ns: int | None = None
        self.jump_guard = ForwardJumpGuard(forward_jump_s)
        self.resolution_guard = ResolutionGuard(resolution_change_frames)
        self._held: tuple[np.ndarray | str | Path, int, str] | None = None

    @property
    def last_stamp_ns(self) -> int | None:
        """Stamp of the last frame that passed the stamp check, None after a reset."""
        return self._last_stamp_ns

    @property
    def held_stamp_ns(self) -> int | None:
        """Stamp of the frame held for confirmation, if any (lost if the stream ends here)."""
        return None if self._held is None else self._held[1]

    def feed(self, image: np.ndarray | str | Path, stamp_ns: int) -> FeedResult:
        """Check the stamp, feed the frame, reset and feed it again where the policy says.

        A frame held by the previous call is fed first when this frame confirms it, else
        dropped (``held_drop``).

        Args:
            image: as ``StreamingSession.step`` takes it.
            stamp_ns: the frame's timestamp in nanoseconds.

        Returns:
            The predictions and what happened.

        Raises:
            Exception: whatever ``session.step`` raises outside the policy, unless
                ``reset_on_error``.
        """
        held, self._held = self._held, None
        if held is None:
            return self._feed_one(image, stamp_ns)
        held_image, held_stamp, why = held
        if self.jump_guard.confirms(held_stamp, stamp_ns):
            first = self._feed_one(held_image, held_stamp, confirmed=True)
            second = self._feed_one(image, stamp_ns)
            # A reset for the second frame ends the map the first one's predictions belong to.
            return dataclasses.replace(
                second, predictions=second.predictions if second.resets else
                first.predictions + second.predictions,
                resets=first.resets + second.resets,
                held_drop=None if first.drop is None else
                dataclasses.replace(first.drop, stamp_ns=held_stamp))
        outlier = FrameDrop('stamp_jump_ahead', why, held_stamp)
        return dataclasses.replace(self._feed_one(image, stamp_ns), held_drop=outlier)

    def _feed_one(self, image: np.ndarray | str | Path, stamp_ns: int,
                  confirmed: bool = False) -> FeedResult:
        resets: list[SessionReset] = []
        if confirmed:  # a held frame the next one vouched for: its stamp becomes the reference
            drop, self._last_stamp_ns = None, stamp_ns
        else:
            drop = self._check_stamp(stamp_ns, resets)
        if drop is not None and drop.reason == _HOLD:
            self._held = (image, stamp_ns, drop.detail)
            return FeedResult([], held=True)
        if drop is not None:
            return FeedResult([], drop=drop)
        for attempt in range(2):
            try:
                preds = self._session.step(image, stamp_ns)
                self.resolution_guard.clear()
                return FeedResult(preds, tuple(resets), accepted=True)
            except errors.InvalidFrameError as exc:
                return FeedResult([], tuple(resets), FrameDrop('invalid_frame', str(exc)))
            except errors.NonFiniteOutputError as exc:
                # Caught before its base class SessionLimitError: no second try here.
                resets.append(self._reset('nan_pose', str(exc)))
            except errors.ResolutionChangedError as exc:
                if attempt == 0 and not self.resolution_guard.observe(
                        getattr(image, 'shape', (None,))[:2]):
                    return FeedResult([], tuple(resets),
                                      FrameDrop('resolution_mismatch', str(exc)))
                resets.append(self._reset('resolution_changed', str(exc)))
                if attempt == 0:
                    self._last_stamp_ns = stamp_ns
                    continue
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
        self._held = None
        self.jump_guard.clear()
        self.resolution_guard.clear()
        if self._on_reset is not None:
            self._on_reset()
        return cleared

    def _check_stamp(self, stamp_ns: int, resets: list[SessionReset]) -> FrameDrop | None:
        last = self._last_stamp_ns
        if last is None or stamp_ns > last:
            ahead = None if last is None else self.jump_guard.check(last, stamp_ns)
            if ahead is not None:
                return FrameDrop(_HOLD, ahead)
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
