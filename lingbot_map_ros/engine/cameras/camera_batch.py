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
results, drops, resets, held frames and rollovers. Only the model's frame-wise work of the
frames that are plain streaming frames runs once for all of them (``model/batched.py``; each
stream's cache attention stays its own). Each frame goes through three phases:

1. **Prepare**, in the feeders' order: the feeder's stamp checks (``StreamFeeder.admit``),
   preprocessing, and the session's plan of its next frame (``frame_job``). A frame that
   cannot batch runs right here, alone, through ``StreamFeeder.feed`` or ``complete``: a held
   frame before it, a frame the stamp checks stop, a stream in its scale phase, at its first
   frame or a new size, a rollover due, an image preprocessing refuses.
2. **Run** (:func:`run_jobs`): the planned frames of one engine, depth setting and size run as
   one batch under the engine's lock (on CUDA with the fast path on, the batch's fixed-shape
   segments replay as CUDA graphs per batch size, or with whole frames the whole batch, every
   stream's cache attention included, is one CUDA graph: ``BatchGraphs``). Each frame is first
   checked against its stream's limits (``Aggregator.prepare``); a refused frame leaves the
   batch with its error and the others go on. A batch of one runs the stream's own
   single-frame call (its fast path: whole-frame CUDA graphs).
3. **Finish**, in the feeders' order: the session takes its frame's output, or its error, as
   its own step would have (``finish_job``), inside the feeder's policy (``complete``): a
   session limit resets the stream and the frame runs again alone, a bad pose resets it.

Streams are independent, so running the unbatched frames before the batch changes no result.
An exception outside a feeder's policy (``reset_on_error`` off) does not stop the other
frames: :class:`BatchFeedError` is raised at the end and carries every frame's result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
import functools
import time

from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.frames import frame_tag, FrameTag
from lingbot_map_ros.engine.model.batched import BatchCall, BatchGraphs
from lingbot_map_ros.engine.profiling import step_range
from lingbot_map_ros.engine.session.frame_job import FrameJob
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.engine.session.stream_feeder import FeedResult, Image, StreamFeeder
import torch


class BatchFeedError(Exception):
    """Frames of a batch raised outside their feeder's policy; the other frames were fed."""

    def __init__(self, results: list[FeedResult | None],
                 errors: list[tuple[int, Exception]]) -> None:
        """Keep every frame's result (None where it raised) and the errors by position."""
        super().__init__('; '.join(f'frame {k}: {type(e).__name__}: {e}' for k, e in errors))
        self.results = results
        self.errors = errors


@dataclass(frozen=True)
class JobOutcome:
    """What the batch gave one job: the model output or its error, and the batch's time."""

    out: dict | Exception
    model_ms: float
    batch_size: int
    """Frames of the batch the job ran in (1: alone)."""


@dataclass
class BatchStats:
    """Counters of batched feeding, for diagnostics (``feed_batch(..., stats=)``)."""

    batches: int = 0
    """Model calls that ran two frames or more together."""
    batched_frames: int = 0
    """Frames that ran in such a call."""
    alone_frames: int = 0
    """Frames that reached the model alone (scale phase, rollover, batch of one, ...)."""


def feed_batch(feeders: Sequence[StreamFeeder], images: Sequence[Image],
               tags: Sequence[FrameTag | int],
               stats: BatchStats | None = None) -> list[FeedResult]:
    """Feed one frame to each feeder, the eligible frames' model work as one batch.

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
    planned: list[tuple[int, tuple, FrameJob]] = []
    for k, (feeder, image, raw_tag) in enumerate(zip(feeders, images, tags)):
        tag = frame_tag(raw_tag)
        try:
            if feeder.held is not None:
                results[k] = feeder.feed(image, tag)
                continue
            admitted = feeder.admit(image, tag)
            if isinstance(admitted, FeedResult):
                results[k] = admitted
                continue
            job = _plan(feeder, image, tag)
            if isinstance(job, FrameJob):
                planned.append((k, admitted, job))
            else:
                results[k] = feeder.complete(image, tag, admitted, job)
        except Exception as exc:  # noqa: BLE001 - reported with the others (BatchFeedError)
            errors.append((k, exc))
    if stats is not None:
        stats.alone_frames += sum(r is not None and r.accepted for r in results)
    outcomes = run_jobs([job for _, _, job in planned], stats)
    for (k, resets, job), outcome in zip(planned, outcomes):
        feeder = feeders[k]
        finish = functools.partial(feeder.session.finish_job, job, outcome.out,
                                   outcome.model_ms)
        try:
            results[k] = feeder.complete(images[k], job.tag, resets, finish)
        except Exception as exc:  # noqa: BLE001 - reported with the others (BatchFeedError)
            errors.append((k, exc))
    if errors:
        raise BatchFeedError(results, sorted(errors, key=lambda e: e[0]))
    return results  # type: ignore[return-value]


def run_jobs(jobs: Sequence[FrameJob], stats: BatchStats | None = None) -> list[JobOutcome]:
    """Run planned frames, one batch per engine, depth setting and image size.

    ``stats``, when given, counts the batches and the frames that ran in them or alone.

    Returns:
        Per job, its output or its error (the others are not disturbed by it).
    """
    outcomes: list[JobOutcome | None] = [None] * len(jobs)
    groups: dict[tuple, list[int]] = {}
    for i, job in enumerate(jobs):
        key = (id(job.stream.engine), job.with_depth, tuple(job.image.shape))
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        group = _run_group([jobs[i] for i in members])
        for i, outcome in zip(members, group):
            outcomes[i] = outcome
        ran = sum(not isinstance(o.out, Exception) for o in group)
        if stats is not None and group[0].batch_size > 1:
            stats.batches += 1
            stats.batched_frames += ran
        elif stats is not None:
            stats.alone_frames += ran
    return outcomes  # type: ignore[return-value]


def _plan(feeder: StreamFeeder, image: Image, tag: FrameTag
          ) -> FrameJob | Callable[[], list[FramePrediction]]:
    """Return the frame's job, or the step that runs it alone (``feed_batch`` step 1)."""
    session = feeder.session
    try:
        tensor, info, preprocess_ms = session.preprocess(image)
    except Exception:  # noqa: BLE001 - the frame's own step meets the error again, in policy
        return functools.partial(session.step, image, tag)
    job = session.frame_job(tensor, info, tag, preprocess_ms)
    return job or functools.partial(session.step_tensor, tensor, info, tag, preprocess_ms)


def batch_graphs(engine: Engine) -> BatchGraphs:
    """Return the engine's batch graphs, built at its first batch (``Engine.batch_graphs``).

    CUDA graphs on CUDA with the fast path on; whole batches over the staged cache where the
    fast path runs whole frames (on the CPU those run eagerly), compiled with ``compile``.
    """
    graphs = engine.batch_graphs
    if graphs is None:
        mode = engine.fast_path.mode
        capture = engine.device.type == 'cuda' and mode.aggregator != 'eager'
        graphs = engine.batch_graphs = BatchGraphs(
            capture, functools.partial(engine.fast_path.fall_back, 'batch_capture'),
            staged=mode.aggregator == 'whole_frame', compile_bodies=mode.compiled,
            lanes=engine.config.cache.kernel.lanes)
    return graphs


def _run_group(jobs: list[FrameJob]) -> list[JobOutcome]:
    """Run jobs of one engine, depth setting and size as one batch (module docstring, 2)."""
    engine = jobs[0].stream.engine
    agg = engine.model.aggregator
    with engine.lock, engine.profiled():
        errors: dict[int, Exception] = {}
        ready: list[int] = []
        patch_hw = (0, 0)
        for i, job in enumerate(jobs):
            try:
                with step_range('prepare'):
                    patch_hw = agg.prepare(job.image, job.time_index, job.role,
                                           job.stream.state.kv)
                ready.append(i)
            except Exception as exc:  # noqa: BLE001 - the frame's own finish raises it
                errors[i] = exc
        start = time.perf_counter()
        outs: dict[int, dict | Exception] = dict(errors)
        try:
            if len(ready) == 1:
                job = jobs[ready[0]]
                outs[ready[0]] = job.stream.forward_frame(
                    job.image, job.time_index, job.keyframe, job.with_depth,
                    with_descriptor=job.with_descriptor)
            elif ready:
                states = [jobs[i].stream.state for i in ready]
                calls = [(state, BatchCall(state.kv, jobs[i].time_index, jobs[i].role))
                         for i, state in zip(ready, states)]
                images = torch.cat([jobs[i].image for i in ready])
                with step_range('forward batch'):
                    batch = engine.model.forward_batch(
                        images, calls, patch_hw, jobs[ready[0]].with_depth, engine.runner,
                        batch_graphs(engine), any(jobs[i].with_descriptor for i in ready))
                for i, out in zip(ready, batch):
                    if not jobs[i].with_descriptor:
                        out.pop('descriptor', None)  # only keyframes that ask carry one
                    outs[i] = out
        except Exception as exc:  # noqa: BLE001 - every frame of the batch failed with it
            outs.update((i, exc) for i in ready)
        if engine.device.type == 'cuda':
            with step_range('wait (sync)'):
                torch.cuda.synchronize(engine.device)
        model_ms = (time.perf_counter() - start) * 1e3
    return [JobOutcome(outs[i], model_ms if i in ready else 0.0, len(ready))
            for i in range(len(jobs))]
