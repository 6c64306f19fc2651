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
"""Runner: the one entry that runs the model, ``run(jobs) -> outcomes``; a frame is a batch of one.

The model (``model/gct.py``) keeps the eager forward, the per-layer steps and the heads' steps
and knows nothing about graphs; the runner holds the execution: the mode in effect
(``fast_path.py``), the aggregator's batch graphs (``batch_runs.py``), the heads' captured
steps (``head_steps.py``) and the side streams (``lanes.py``). The engine builds one runner for
its model; every job brings its stream's caches, so it serves every stream of the engine.

:meth:`Runner.run` checks every job (``Aggregator.prepare``: a refused job gets its error and
the others go on), then dispatches each group of jobs on one key, as vLLM's CUDA-graph
dispatcher does with its batch descriptor:

* a scale pass: the model's eager forward, alone;
* streaming frames of one size and depth setting: one batch of all of them (one frame is a
  batch of one), whose aggregator runs by the mode in effect (segments or whole batches, graphs
  keyed by batch size, shapes, dtypes, compile and staged keys: ``segments.BatchKey``); then the
  camera head per job on its stream's cache and the depth head on the batch, side by side on
  the lanes. With the mode 'eager' (the CPU, or after a refused capture) a batch of one is the
  model's eager forward and a larger batch runs the same segments uncaptured.

Modes (``FastPathMode.aggregator``: the mode asked for is an upper bound; the pool's backend
caps it and a step-down lowers it): ``eager``, ``segments``, ``whole_frame``. ``compile`` is
orthogonal: it ``torch.compile``s the fixed-shape work of whichever fast path is in effect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .batch_runs import BatchRuns
from .fast_path import FastPathState
from .head_steps import HeadSteps
from .jobs import Job
from ..cache.kv_pool import KVPool
from ..cache.staged_frames import can_stage
from ..model.gct import LingbotMapModel
from ..model.place_descriptor import place_descriptor
from ..profiling import step_range

Result = tuple[dict | Exception, int]
"""A job's output (or error) and the size of the batch it ran in."""


class Runner:
    """Runs an engine's jobs on its model, through the fast path where it is on and works.

    Args:
        model: the network (weights loaded, on its device).
        fast_path: the engine's mode and fallback counters (a new state, fast path off, when
            None).
        lanes: run the per-stream work of a batch on side streams (``cache.kernel.lanes``).
    """

    def __init__(self, model: LingbotMapModel, fast_path: FastPathState | None = None,
                 lanes: bool = True) -> None:
        self._model = model
        self.fast_path = fast_path if fast_path is not None else FastPathState()
        """The mode in effect and the fallback counters (the engine's)."""
        self.heads = HeadSteps(model.aggregator, model.camera_head, model.depth_head,
                               self.fast_path)
        """The heads' captured steps, by head and stream."""
        self.batches = BatchRuns(model.aggregator, self.fast_path, lanes)
        """The aggregator's batch graphs."""
        self._pool: KVPool | None = None

    def bind_pool(self, pool: KVPool | None) -> None:
        """Plan for ``pool`` (the engine's, once built): its backend caps the mode."""
        if pool is self._pool:
            return
        self.batches.drop()  # graphs of another pool write into its storage
        self._pool = pool
        if pool is None:
            self.fast_path.bind(None, False)
            return
        self.fast_path.bind(pool.backend, can_stage(pool),
                            f"backend '{pool.backend_name}' with {pool.dtype} on "
                            f'{pool.device.type} runs segments only')

    def release_stream(self, camera_cache: object) -> None:
        """Drop the head steps captured against a closed stream's camera cache."""
        self.heads.release_stream(camera_cache)

    def dino(self, images: torch.Tensor) -> torch.Tensor:
        """Return the DINO tokens of one frame (``HeadSteps.dino``: a rollover's preparation)."""
        return self.heads.dino(images)

    # ---- run ------------------------------------------------------------------------------

    @torch.no_grad()
    def run(self, jobs: Sequence[Job]) -> list[Result]:
        """Run ``jobs`` (each on another stream): groups that can share a batch run as one.

        Returns:
            Per job, its output (as ``LingbotMapModel.forward``) or the error that refused it
            or its batch, and the size of that batch.

        Raises:
            ValueError: a stream appears twice.
        """
        if len({id(job.stream) for job in jobs}) != len(jobs):
            raise ValueError('Runner.run: a stream appears twice in one run')
        results: list[Result | None] = [None] * len(jobs)
        groups: dict[tuple, list[tuple[int, tuple[int, int]]]] = {}
        for i, job in enumerate(jobs):
            try:
                with step_range('prepare'):
                    patch_hw = self._model.aggregator.prepare(job.images, job.time_index,
                                                              job.mode, job.stream.kv)
            except Exception as exc:  # noqa: BLE001 - the job's own outcome
                results[i] = (exc, 1)
                continue
            self.bind_pool(job.stream.kv.pool)
            key = (('scale', i) if job.mode == 'scale'
                   else (job.with_depth, tuple(job.images.shape)))
            groups.setdefault(key, []).append((i, patch_hw))
        eager = self.fast_path.mode.aggregator == 'eager'
        for key, members in groups.items():
            group = [jobs[i] for i, _ in members]
            try:
                outs = (self._eager(group[0]) if key[0] == 'scale' or (eager and len(group) == 1)
                        else self._batch(group, members[0][1]))
            except Exception as exc:  # noqa: BLE001 - every job of the batch failed with it
                outs = [exc] * len(group)
            for (i, _), out in zip(members, outs):
                results[i] = (out, len(group))
        return results  # type: ignore[return-value]

    def _eager(self, job: Job) -> list[dict]:
        """Run a job alone on the model's eager forward."""
        with step_range('forward eager'):
            return [self._model(job.images, job.time_index, job.mode, job.stream,
                                job.with_depth, job.return_taps, job.with_descriptor)]

    def _batch(self, jobs: Sequence[Job], patch_hw: tuple[int, int]) -> list[dict]:
        """Run streaming frames of one size and depth setting as one batch."""
        model = self._model
        images = jobs[0].images if len(jobs) == 1 else torch.cat([job.images for job in jobs])
        with step_range('forward batch'), model.call_context(jobs[0].stream):
            with step_range('aggregator'):
                features = self.batches.run(images, jobs, patch_hw)
            poses, depth = self._heads(jobs, features.taps, tuple(images.shape[-2:]))
        outs: list[dict] = [{'pose_enc': pose, 'pose_enc_iters': iters} for pose, iters in poses]
        descriptors = (place_descriptor(features.dino_tokens)
                       if any(job.with_descriptor for job in jobs) else None)
        for row, (job, out) in enumerate(zip(jobs, outs)):
            rows = slice(row, row + 1)
            if depth is not None:
                out['depth'], out['depth_conf'] = depth[0][rows], depth[1][rows]
            if job.return_taps:
                out['taps'] = [tap[rows] for tap in features.taps]
                out['dino_tokens'] = features.dino_tokens[rows]
            if descriptors is not None and job.with_descriptor:
                out['descriptor'] = descriptors[rows]
        return outs

    def _heads(self, jobs: Sequence[Job], taps: list[torch.Tensor], image_hw: tuple[int, ...]
               ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]],
                          tuple[torch.Tensor, torch.Tensor] | None]:
        """Run the camera head of each job on its stream's cache, the depth head on the batch.

        Independent work: with the lanes on, each camera head replays on a side stream beside
        the depth head (``lanes.py``). A camera cache that must grow does it here, first: a
        lane must not free the old buffer while reading it.
        """
        model, heads = self._model, self.heads
        depth: list[tuple[torch.Tensor, torch.Tensor]] = []

        def camera(row: int, job: Job) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
            def run() -> tuple[torch.Tensor, torch.Tensor]:
                with model.call_context(job.stream):
                    return heads.camera(taps[-1][row:row + 1, 0], job.mode)
            return run

        def depth_head() -> None:
            depth.append(heads.depth(taps, image_hw))

        for job in jobs:
            with model.call_context(job.stream):
                model.camera_head.reserve_cache(job.stream.camera.num_frames + 1)
        work = [camera(row, job) for row, job in enumerate(jobs)]
        with step_range('lanes'):
            poses: list[Any] = self.batches.lanes.run(
                taps[-1].device, work, depth_head if jobs[0].with_depth else None)
        return poses, (depth[0] if depth else None)

    # ---- warm-up ----------------------------------------------------------------------------

    @torch.no_grad()
    def prepare_full_window(self, job: Job) -> None:
        """Capture the full-window graphs of a batch of one on ``job``'s stream now.

        Writes placeholders into the stream's pages: reset it before its next frame.
        """
        agg = self._model.aggregator
        self.bind_pool(job.stream.kv.pool)  # as run does: the pool's backend caps the mode
        patch_hw = (job.images.shape[-2] // agg.config.patch_size,
                    job.images.shape[-1] // agg.config.patch_size)
        with self._model.call_context(job.stream):
            self.batches.prepare_full_window(job.images, job, patch_hw)
