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
"""BatchRuns: the aggregator over a batch of jobs on the fast path (segments or whole batches).

Dims: B jobs (one streaming frame each, each on another stream; B = 1 for a single frame).

Everything a frame does on its own runs once for the B frames (DINO, the special tokens, the
frame blocks, the global blocks' projections and MLPs, the taps); what reads a stream's state
stays per job: each global block's cache attention goes through that job's own pages and plan,
and each frame rotates with its own time index. Row b therefore computes what job b alone
computes, on the same kernels; only the GEMMs see B*P rows instead of P.

How, by the mode in effect (``fast_path.py``):

* ``segments``: the segments (``segments.py``) replayed as CUDA graphs, captured per
  :class:`~.segments.BatchKey` the first time that key runs, each job's cache attention eager
  between them (FlashInfer's plan is host work);
* ``whole_frame``: where the pool can stage, the whole batch is one CUDA graph per key, every
  job's cache writes and attentions inside (``whole_batch.py``).

On the CPU nothing is captured: the same functions run eagerly (the CPU tests check the
segmentation and the staging order the GPU replays). Step-downs are reported to the engine's
:class:`FastPathState`: a whole batch that cannot be captured ('whole_frame'), a backend that
supplies no capturable attention ('backend_refused'), a segment whose compiled body fails
('compile') or whose capture is refused ('capture': the runner runs jobs eagerly from then on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TYPE_CHECKING

import torch

from .captured import CapturedCall
from .fast_path import FastPathState
from .lanes import Lanes
from .segments import (batch_inputs, batch_key, BatchKey, Bodies, CONSTANT_INPUTS, layer_loop,
                       Segment, segments)
from .whole_batch import WholeBatches
from ..cache.kv_pool import KVPool
from ..cache.planned import planned
from ..cache.staged_frames import can_stage
from ..errors import CacheStateError
from ..model.aggregator import Aggregator, AggregatorOutput

if TYPE_CHECKING:
    from .jobs import Job


class BatchRuns:
    """The engine's batch graphs: segments per batch key, whole batches over its pool.

    Args:
        aggregator: the model's aggregator.
        fast_path: the engine's mode, read at every batch and lowered on a step-down.
        lanes: run the per-stream work on side streams (``cache.kernel.lanes``).
    """

    def __init__(self, aggregator: Aggregator, fast_path: FastPathState,
                 lanes: bool = True) -> None:
        self._agg = aggregator
        self.fast_path = fast_path
        self.lanes = Lanes(lanes)
        """Side streams of the per-stream work (cache attentions, camera heads): ``lanes.py``."""
        self._bodies = Bodies(False)
        self._graph_pool: Any = None
        self._specials: dict[tuple, torch.Tensor] = {}
        self._sets: dict[BatchKey, list[CapturedCall]] = {}
        self._whole: WholeBatches | None = None

    @property
    def bodies(self) -> Bodies:
        """Return the segment bodies of the compile setting in effect (built on first use)."""
        compiled = self.fast_path.mode.compiled
        if self._bodies.compiled != compiled:
            self._bodies = Bodies(compiled)
        return self._bodies

    @property
    def captured(self) -> int:
        """Return the segment graphs captured so far, over every batch key."""
        return sum(len(replays) for replays in self._sets.values())

    @property
    def whole(self) -> WholeBatches | None:
        """Return the whole batches of the bound pool; None before any (or after a failure)."""
        return self._whole

    def graph_pool(self) -> Any:
        """Return the memory pool the batches' graphs share (made on first use)."""
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        return self._graph_pool

    def inputs(self, images: torch.Tensor, jobs: Sequence[Job],
               patch_hw: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        """Return the images and the batch's ``batch_inputs``; specials made once per size."""
        weights = self._agg.camera_token
        key = (len(jobs), weights.dtype, weights.device, weights.data_ptr())
        specials = self._specials.get(key)
        if specials is None:
            # Streaming frames all take variant 1 of every special token, keyframe or not.
            specials = self._specials[key] = self._agg.special_tokens(len(jobs), 'keyframe',
                                                                      weights.dtype)
        return (images, *batch_inputs(self._agg, images, jobs, patch_hw, specials))

    def drop(self) -> None:
        """Release every graph (they read and write the storage of a pool being replaced)."""
        self._sets.clear()
        self._whole = None

    def run(self, images: torch.Tensor, jobs: Sequence[Job],
            patch_hw: tuple[int, int]) -> AggregatorOutput:
        """Run the aggregator over ``images`` [B, 3, H, W], row b job b's frame.

        The jobs have passed ``Aggregator.prepare``; with the mode 'eager' nothing is captured.

        Returns:
            The B frames' taps ([B, P, 2C] each) and DINO tokens.
        """
        pool = jobs[0].stream.kv.pool
        whole = self._whole_for(pool, images)
        if whole is not None:
            dino, *taps = whole.run(self._agg, self, images, jobs, patch_hw,
                                    lambda exc: self.fast_path.fall_back('whole_frame', exc))
        else:
            dino, *taps = self._segments(images, jobs, patch_hw)
        return AggregatorOutput(taps=list(taps), dino_tokens=dino, patch_hw=patch_hw)

    def prepare_full_window(self, images: torch.Tensor, job: Job,
                            patch_hw: tuple[int, int]) -> None:
        """Capture the whole-frame graphs of a full window for a batch of one now.

        Writes placeholders into ``job``'s pages: reset its stream before its next frame.
        """
        whole = self._whole_for(job.stream.kv.pool, images)
        if whole is not None:
            whole.prepare_full_window(self._agg, self, images, job, patch_hw,
                                      lambda exc: self.fast_path.fall_back('whole_frame', exc))

    def run_eager(self, fn: Segment, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run segment ``fn`` now (no capture here): a compiled body that fails steps down.

        Inductor fails on the first call of a body (no C++ compiler, no Triton): that is
        counted ('compile') and the segment runs again on the plain bodies (a segment is a pure
        function of its inputs). Inside a capture it just runs: the capture's caller falls back.
        """
        capturing = inputs[0].is_cuda and torch.cuda.is_current_stream_capturing()
        if capturing or not self.bodies.compiled:
            return fn(*inputs)
        try:
            return fn(*inputs)
        except Exception as exc:  # noqa: BLE001 - Inductor/Triton raise many kinds
            self.fast_path.fall_back('compile', exc)
            return fn(*inputs)

    def _whole_for(self, pool: KVPool, images: torch.Tensor) -> WholeBatches | None:
        """Return the whole batches over ``pool`` with slots built, or None: segments."""
        if self.fast_path.mode.aggregator != 'whole_frame' or not can_stage(pool):
            return None
        if self._whole is None or self._whole.pool is not pool:
            self._whole = None  # release the old pool's graphs first
            self._whole = WholeBatches(pool, images.is_cuda, self.fast_path.mode.compiled)
        try:
            self._whole.slots_for(images.shape[0])
        except CacheStateError as exc:
            self._whole = None
            self.fast_path.fall_back('backend_refused', exc)
            return None
        except Exception as exc:  # noqa: BLE001 - Inductor/Triton raise many kinds
            self._whole = None
            self.fast_path.fall_back('whole_frame', exc)
            return None
        return self._whole

    def _segments(self, images: torch.Tensor, jobs: Sequence[Job],
                  patch_hw: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        """Segments (replayed or eager), each job's cache attention eager between them."""
        agg = self._agg
        kv_dtype = jobs[0].stream.kv.dtype
        key = batch_key(agg, images, kv_dtype, self.bodies.compiled)
        _, specials, *tables = inputs = self.inputs(images, jobs, patch_hw)
        constant = [inputs[i] for i in CONSTANT_INPUTS]
        with planned([job.stream.kv.planning(job.mode) for job in jobs]) as plans:

            def run(index: int, fn: Segment, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                return self._segment(key, index, fn, inputs, constant)

            def attend(layer: int, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor) -> torch.Tensor:
                outs = [agg.global_attention(layer, job.stream.kv, plan)(
                    q[j:j + 1], k[j:j + 1], v[j:j + 1]) for j, (job, plan)
                    in enumerate(zip(jobs, plans))]
                return outs[0] if len(outs) == 1 else torch.cat(outs)

            return layer_loop(agg, segments(agg, self, kv_dtype), run, attend, images,
                              specials, tables)

    def _segment(self, key: BatchKey, index: int, fn: Segment, inputs: tuple[torch.Tensor, ...],
                 constant: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Run segment ``index`` of ``key``: replayed (captured the first time) or eagerly.

        Segments of a key are built in order. A capture that fails steps down ('compile' with
        compiled bodies, else 'capture') and the segment runs eagerly on the bodies now in
        effect.
        """
        if not inputs[0].is_cuda or self.fast_path.mode.aggregator == 'eager':
            return self.run_eager(fn, *inputs)
        replays = self._sets.setdefault(key, [])
        if index == len(replays):
            try:
                fixed = [i for i, t in enumerate(inputs) if any(t is c for c in constant)]
                replays.append(CapturedCall(fn, inputs, True, pool=self.graph_pool(),
                                            constant=fixed))
            except Exception as exc:  # noqa: BLE001 - capture/Inductor raise many kinds
                self._sets.clear()
                self.fast_path.fall_back('compile' if key.compiled else 'capture', exc)
                return fn(*inputs)
        elif index > len(replays):
            return fn(*inputs)  # an earlier segment of this batch could not be captured
        return replays[index](*inputs)
