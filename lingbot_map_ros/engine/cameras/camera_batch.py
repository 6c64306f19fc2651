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
"""Frames of several cameras (streams of one engine) fed as one batch.

:func:`feed_batch` is ``[f.feed(i, t) for f, i, t in zip(feeders, images, tags)]``: the same
results, drops, resets, held frames and rollovers, on the same path (``StreamFeeder.feed`` is
this with one camera). Only the model's frame-wise work of the frames that can share a batch
runs once for all of them (``Engine.run``; each stream's cache attention stays its own). Each
frame goes through three phases:

1. **Admit**, in the feeders' order (``StreamFeeder.admit``): a held frame this one confirms
   is fed first, alone; the stamp checks; preprocessing; the session's plan of its model call
   (``frame_job``; a rollover that is due switches here). A frame the stamp checks stop, a
   scale frame that is only buffered or an image preprocessing refuses has no job.
2. **Run** (:func:`run_jobs`): the jobs of each engine go to its ``Engine.run`` at once; the
   streaming frames of one size and depth setting run as one batch, a scale pass alone. A job
   the model refuses (its stream's limits: ``Aggregator.prepare``) gets its error and the
   others go on.
3. **Complete**, in the feeders' order (``StreamFeeder.complete``): the session takes its
   job's outcome, or its error, as its own step would have (``finish_job``), inside the
   feeder's policy: a session limit resets the stream and the frame runs again alone, a bad
   pose resets it.

Streams are independent, so feeding the held frames before the batch changes no result.
An exception outside a feeder's policy (``reset_on_error`` off) does not stop the other
frames: :class:`BatchFeedError` is raised at the end and carries every frame's result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lingbot_map_ros.engine.frames import FrameTag
from lingbot_map_ros.engine.runner.jobs import Outcome
from lingbot_map_ros.engine.session import frame_job
from lingbot_map_ros.engine.session.frame_job import FrameJob
from lingbot_map_ros.engine.session.stream_feeder import FeedResult, FeedStep, Image, StreamFeeder


class BatchFeedError(Exception):
    """Frames of a batch raised outside their feeder's policy; the other frames were fed."""

    def __init__(self, results: list[FeedResult | None],
                 errors: list[tuple[int, Exception]]) -> None:
        """Keep every frame's result (None where it raised) and the errors by position."""
        super().__init__('; '.join(f'frame {k}: {type(e).__name__}: {e}' for k, e in errors))
        self.results = results
        self.errors = errors


@dataclass
class BatchStats:
    """Counters of batched feeding, for diagnostics (``feed_batch(..., stats=)``)."""

    batches: int = 0
    """Model calls that ran two frames or more together."""
    batched_frames: int = 0
    """Frames that ran in such a call."""
    alone_frames: int = 0
    """Frames taken otherwise: alone (scale pass, batch of one), buffered, fed again alone."""


def feed_batch(feeders: Sequence[StreamFeeder], images: Sequence[Image],
               tags: Sequence[FrameTag | int],
               stats: BatchStats | None = None) -> list[FeedResult]:
    """Feed one frame to each feeder, the model calls of one engine in one ``Engine.run``.

    Args:
        feeders: one per camera, each a different stream (usually of one engine).
        images: per feeder, its frame (as ``StreamingSession.step`` takes it).
        tags: per feeder, the frame's tag or stamp in nanoseconds.
        stats: counters to add this call's batching to.

    Returns:
        Per feeder, what ``feeder.feed(image, tag)`` returns.

    Raises:
        ValueError: lengths differ or a feeder appears twice.
        BatchFeedError: frames raised outside their feeder's policy (module docstring).
    """
    if not len(feeders) == len(images) == len(tags):
        raise ValueError(f'feed_batch: {len(feeders)} feeders, {len(images)} images, '
                         f'{len(tags)} tags')
    if len({id(f) for f in feeders}) != len(feeders):
        raise ValueError('feed_batch: a feeder appears twice')
    results: list[FeedResult | None] = [None] * len(feeders)
    errors: list[tuple[int, Exception]] = []
    steps: dict[int, FeedStep] = {}
    for k, (feeder, image, tag) in enumerate(zip(feeders, images, tags)):
        try:
            steps[k] = feeder.admit(image, tag)
        except Exception as exc:  # noqa: BLE001 - reported with the others (BatchFeedError)
            errors.append((k, exc))
    planned = [k for k, step in steps.items() if step.job is not None]
    outcomes = dict(zip(planned, run_jobs([steps[k].job for k in planned], stats)))
    for k, step in steps.items():
        outcome = outcomes.get(k)
        try:
            results[k] = result = feeders[k].complete(step, outcome)
        except Exception as exc:  # noqa: BLE001 - reported with the others (BatchFeedError)
            errors.append((k, exc))
            continue
        if stats is not None and result.accepted and (
                outcome is None or isinstance(outcome.out, Exception)):
            stats.alone_frames += 1  # buffered, or fed again alone after a reset
    if errors:
        raise BatchFeedError(results, sorted(errors, key=lambda e: e[0]))
    return results  # type: ignore[return-value]


def run_jobs(jobs: Sequence[FrameJob], stats: BatchStats | None = None) -> list[Outcome]:
    """Run planned jobs, one ``Engine.run`` per engine (``frame_job.run_jobs``).

    ``stats``, when given, counts the batches and the jobs that ran in them or alone.

    Returns:
        Per job, its outcome (a refused job's error does not disturb the others).
    """
    outcomes = frame_job.run_jobs(jobs)
    if stats is not None:
        ran = [o for o in outcomes if not isinstance(o.out, Exception)]
        # Each job of a batch of B reports B: each adds 1/B of the batch.
        stats.batches += round(sum(1 / o.batch_size for o in ran if o.batch_size > 1))
        stats.batched_frames += sum(o.batch_size > 1 for o in ran)
        stats.alone_frames += sum(o.batch_size == 1 for o in ran)
    return outcomes
