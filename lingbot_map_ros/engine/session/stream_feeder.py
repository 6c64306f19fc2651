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
"""StreamFeeder: the one policy for feeding a stream of tagged frames to a StreamingSession.

The node's worker (``ros/inference/session_runner.py``) and the offline replay
(``tools/offline.py``) both feed frames through a :class:`StreamFeeder`, so they drop and reset on
the same conditions, checked in this order:

=======================  ===============================================================
condition                what happens
=======================  ===============================================================
stamp not newer          dropped as ``stamp_out_of_order`` (small step back, duplicate)
stamp jumps back         session reset (``clock_jump``), the frame starts the new map
stamp far ahead          held (:class:`FrameHeld`); fed before the next frame if that one
                         comes after it, else dropped as ``stamp_jump_ahead``
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
resolution-change count are :mod:`~lingbot_map_ros.engine.session.stream_guards`. Whether a reset
keeps the frame is ``POLICY[reason].frame_kept`` (:mod:`~lingbot_map_ros.engine.session.reasons`).
Each frame carries its :class:`~lingbot_map_ros.engine.frames.FrameTag` into the session and back
on its prediction, and every drop and hold names the tag of its frame, so callers keep no tables.
The feeder only decides and reports: each :class:`FeedResult` says what happened, and the
caller counts, logs and clears its own outputs. A frame goes through the feeder in two phases
around its session's model call: :meth:`StreamFeeder.admit` (stamp checks, the session's plan:
a :class:`FeedStep`), the job run by its engine, :meth:`StreamFeeder.complete` (the outcome
through the policy); :meth:`StreamFeeder.feed` is the three for one frame, and
``cameras/camera_batch.py`` runs several cameras' jobs between the phases as one batch. It
holds no lock; a caller that resets from another thread serialises :meth:`StreamFeeder.feed`
and :meth:`StreamFeeder.reset` itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lingbot_map_ros.engine import errors
from lingbot_map_ros.engine.frames import frame_tag, FrameTag
from lingbot_map_ros.engine.runner.jobs import Outcome
from lingbot_map_ros.engine.session.frame_job import FrameJob, run_jobs
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.engine.session.reasons import POLICY, Reason
from lingbot_map_ros.engine.session.stream_guards import ForwardJumpGuard, ResolutionGuard
import numpy as np

# Engine errors that reset the session, most specific first; anything else is engine_error.
_RESET_REASONS: tuple[tuple[type[Exception], Reason], ...] = (
    (errors.NonFiniteOutputError, Reason.NAN_POSE),
    (errors.ResolutionChangedError, Reason.RESOLUTION_CHANGED),
    (errors.TimeIndexLimitError, Reason.TIME_INDEX_LIMIT),
    (errors.CachePoolExhaustedError, Reason.CACHE_FULL),
    (errors.SessionLimitError, Reason.SESSION_LIMIT))
Image = np.ndarray | str | Path


@dataclass(frozen=True, slots=True)
class FrameDrop:
    """A frame the session did not take; the session is unchanged."""

    reason: Reason
    """``stamp_out_of_order``, ``stamp_jump_ahead``, ``resolution_mismatch`` or
    ``invalid_frame``."""
    detail: str
    """What was wrong, for logs and diagnostics."""
    tag: FrameTag
    """The dropped frame (for a held frame, from an earlier call)."""


@dataclass(frozen=True, slots=True)
class FrameHeld:
    """A frame held back (stamp far ahead): fed or dropped with the next frame."""

    tag: FrameTag
    """The held frame."""
    detail: str
    """Why it is held, for logs (and the drop's detail if nothing confirms it)."""


@dataclass(frozen=True, slots=True)
class SessionReset:
    """A session reset the feeder made; the map starts again."""

    reason: Reason
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
    """What the session returned, all from the session after the last reset; each carries
    the tag of its frame."""
    resets: tuple[SessionReset, ...] = ()
    """Resets made for this frame, in order (all before ``drop``)."""
    drop: FrameDrop | None = None
    """Why the session did not take the frame, when it was dropped."""
    accepted: bool = False
    """The session took the frame: its prediction is in ``predictions`` or comes later."""
    held: FrameHeld | None = None
    """The frame is held (stamp far ahead): it is fed or dropped with the next call."""
    held_drop: FrameDrop | None = None
    """The frame held by the previous call was dropped (an outlier, or refused when fed)."""


@dataclass(frozen=True, slots=True)
class FeedStep:
    """A frame between :meth:`StreamFeeder.admit` and :meth:`StreamFeeder.complete`."""

    image: Image
    tag: FrameTag
    resets: tuple[SessionReset, ...] = ()
    """Resets the stamp made (a clock jump)."""
    job: FrameJob | None = None
    """The model call to run (``frame_job.run_jobs``); None: nothing to run."""
    error: Exception | None = None
    """Why planning refused the frame; :meth:`StreamFeeder.complete` meets it in the policy."""
    stopped: FeedResult | None = None
    """The result when the stamp checks stopped the frame (dropped, held)."""
    before: FeedResult | None = None
    """What the frame held by the previous call gave (fed first), or its drop."""


class StreamFeeder:
    """Owns the last accepted stamp and feeds a session's frames with the policy above."""

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
        self._held: tuple[Image, FrameHeld] | None = None

    @property
    def last_stamp_ns(self) -> int | None:
        """Stamp of the last frame that passed the stamp check, None after a reset."""
        return self._last_stamp_ns

    @property
    def held(self) -> FrameHeld | None:
        """Return the frame held for confirmation, if any (:meth:`finish` drops it at the end)."""
        return None if self._held is None else self._held[1]

    def feed(self, image: Image, tag: FrameTag | int) -> FeedResult:
        """Check the stamp, feed the frame, reset and feed it again where the policy says.

        A frame held by the previous call is fed first when this frame confirms it, else
        dropped (``held_drop``). The frame goes :meth:`admit`, run, :meth:`complete`: the
        path of several cameras' frames (``cameras/camera_batch.py``) with a batch of one.

        Args:
            image: as ``StreamingSession.step`` takes it.
            tag: the frame's tag (or a plain stamp in nanoseconds); its predictions carry it.

        Returns:
            The predictions and what happened.

        Raises:
            Exception: whatever ``session.step`` raises outside the policy, unless
                ``reset_on_error``.
        """
        return self._run(self.admit(image, tag))

    def finish(self) -> FeedResult:
        """End the stream: run the buffered scale frames; a held frame, never confirmed, drops.

        Returns:
            The last predictions, and the held frame's drop (``held_drop``) if there was one.
        """
        held, self._held = self._held, None
        drop = None if held is None else FrameDrop(
            Reason.STAMP_JUMP_AHEAD, 'the last frame jumped ahead and nothing followed',
            held[1].tag)
        return FeedResult(self._session.flush(), held_drop=drop)

    @property
    def session(self) -> StreamingSession:
        """Return the session this feeder feeds."""
        return self._session

    def admit(self, image: Image, tag: FrameTag | int) -> FeedStep:
        """Phase one of :meth:`feed`: the held frame, the stamp checks, the frame's job.

        A held frame this one confirms is fed here, alone. Then, unless the stamp checks
        stop the frame, it is preprocessed and its session plans its model call
        (``frame_job``); an error on the way is kept for :meth:`complete`.

        Raises:
            Exception: what feeding the held frame raises outside the policy.
        """
        tag = frame_tag(tag)
        held, self._held = self._held, None
        before = None
        if held is not None:
            held_image, hold = held
            if self.jump_guard.confirms(hold.tag.stamp_ns, tag.stamp_ns):
                before = self._feed_one(held_image, hold.tag, confirmed=True)
            else:
                before = FeedResult([], drop=FrameDrop(Reason.STAMP_JUMP_AHEAD, hold.detail,
                                                       hold.tag))
        return dataclasses.replace(self._admit(image, tag), before=before)

    def complete(self, step: FeedStep, outcome: Outcome | None) -> FeedResult:
        """Phase two: take the outcome of ``step``'s job (None: it had none) in the policy.

        A reset's retry feeds the frame again alone (``session.step``).
        """
        def first() -> list[FramePrediction]:
            if step.error is not None:
                raise step.error
            return [] if step.job is None else self._session.finish_job(step.job, outcome)
        result = step.stopped if step.stopped is not None else self._complete(
            step.image, step.tag, list(step.resets), first)
        if step.before is None:
            return result
        # A reset for this frame ends the map the held frame's predictions belong to.
        return dataclasses.replace(
            result, predictions=result.predictions if result.resets else
            step.before.predictions + result.predictions,
            resets=step.before.resets + result.resets, held_drop=step.before.drop)

    def _feed_one(self, image: Image, tag: FrameTag, confirmed: bool = False) -> FeedResult:
        return self._run(self._admit(image, tag, confirmed))

    def _run(self, step: FeedStep) -> FeedResult:
        """Run ``step``'s job as a batch of one and complete it."""
        return self.complete(step, None if step.job is None else run_jobs([step.job])[0])

    def _admit(self, image: Image, tag: FrameTag, confirmed: bool = False) -> FeedStep:
        resets: list[SessionReset] = []
        if confirmed:  # a held frame the next one vouched for: its stamp becomes the reference
            verdict, self._last_stamp_ns = None, tag.stamp_ns
        else:
            verdict = self._check_stamp(image, tag, resets)
        if isinstance(verdict, FrameHeld):
            return FeedStep(image, tag, stopped=FeedResult([], held=verdict))
        if verdict is not None:
            return FeedStep(image, tag, stopped=FeedResult([], tuple(resets), drop=verdict))
        try:
            tensor, info, preprocess_ms = self._session.preprocess(image)
            job = self._session.frame_job(tensor, info, tag, preprocess_ms)
        except Exception as exc:  # noqa: BLE001 - complete() meets it inside the policy
            return FeedStep(image, tag, tuple(resets), error=exc)
        return FeedStep(image, tag, tuple(resets), job)

    def _complete(self, image: Image, tag: FrameTag, resets: list[SessionReset],
                  first_step: Callable[[], list[FramePrediction]]) -> FeedResult:
        for attempt in range(2):
            try:
                preds = first_step() if attempt == 0 else self._session.step(image, tag)
                self.resolution_guard.clear()
                return FeedResult(preds, tuple(resets), accepted=True)
            except errors.InvalidFrameError as exc:
                return FeedResult([], tuple(resets),
                                  FrameDrop(Reason.INVALID_FRAME, str(exc), tag))
            except Exception as exc:  # noqa: BLE001 - sorted by _reset_reason, else re-raised
                reason, failure = self._reset_reason(exc), exc
                if reason is None:
                    raise
            if reason is Reason.RESOLUTION_CHANGED and attempt == 0 and \
                    not self.resolution_guard.observe(getattr(image, 'shape', (None,))[:2]):
                return FeedResult([], tuple(resets), FrameDrop(
                    Reason.RESOLUTION_MISMATCH, str(failure), tag))
            resets.append(self._reset(reason, str(failure),
                                      failure if POLICY[reason].error else None))
            if attempt > 0 or not POLICY[reason].frame_kept:
                break
            # The session was left unchanged, so the frame starts the new one.
            self._last_stamp_ns = tag.stamp_ns
        return FeedResult([], tuple(resets))

    def _reset_reason(self, exc: Exception) -> Reason | None:
        """Map an engine error to its reset; None: not ours to absorb (re-raise)."""
        for kind, reason in _RESET_REASONS:
            if isinstance(exc, kind):
                return reason
        return Reason.ENGINE_ERROR if self._reset_on_error else None

    def reset(self) -> dict[str, int]:
        """Reset the session and forget the last stamp (and a held frame).

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

    def _check_stamp(self, image: Image, tag: FrameTag, resets: list[SessionReset]
                     ) -> FrameDrop | FrameHeld | None:
        """Decide on the stamp: None (feed now), a drop, or a hold (kept with its image)."""
        last, stamp_ns = self._last_stamp_ns, tag.stamp_ns
        if last is None or stamp_ns > last:
            ahead = None if last is None else self.jump_guard.check(last, stamp_ns)
            if ahead is not None:
                hold = FrameHeld(tag, ahead)
                self._held = (image, hold)
                return hold
            self._last_stamp_ns = stamp_ns
            return None
        back_s = (last - stamp_ns) * 1e-9
        if back_s > 0 and back_s >= self.backwards_reset_s:
            resets.append(self._reset(Reason.CLOCK_JUMP, f'stamp went back {back_s:.3f} s'))
            self._last_stamp_ns = stamp_ns
            return None
        return FrameDrop(Reason.STAMP_OUT_OF_ORDER, f'stamp {stamp_ns * 1e-9:.6f} s is not '
                         f'after the previous {last * 1e-9:.6f} s', tag)

    def _reset(self, reason: Reason, detail: str, error: Exception | None = None
               ) -> SessionReset:
        return SessionReset(reason, detail, self.reset(), error)
