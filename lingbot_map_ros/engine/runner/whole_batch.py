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
"""A batch of B jobs' frames as one CUDA graph: batched segments, staged cache attention.

Dims: B jobs (one streaming frame each, each on another stream; B = 1 for a single frame),
P tokens per frame, H heads of D dims.

Why: replaying segments one by one leaves each stream's 24 cache attentions to be issued from
Python between them, with their page bookkeeping (docs/performance.md, 'Whole frames' and
'Batches of cameras'). Here the whole batch is one graph: the segments (``segments.py``) run on
the B*P rows and, per global block, each job's K/V is written and attended through its own
:class:`StagedFrames` (slot b stages the frame of job b; all slots are views of the one pool
and independent: each keeps its own write index and visible run). The B slots' writes and
attentions of a block run on side streams (``lanes.py``): the graph holds them as parallel
branches, joined before the next segment. Where the backend attends several runs in one call
(``fa3``), they are one write and one launch instead (``cache/staged_runs.py``), and the
graph's key says which form it holds.

A graph is keyed by the batch's :class:`~.segments.BatchKey`, which holds the B staged keys
(window filling, or the split of a full window, which fixes where that stream's patch run
lies); it is captured on first use (``capture_graph``: one run on the staged numbers, then the
capture). That first run makes every slot's cache writes exactly as the replay does, so a live
batch can trigger it. The full-window graphs of a batch of one can be captured ahead of time on
placeholder numbers (:meth:`WholeBatches.prepare_full_window`, from the engine's warm-up). A
capture that fails is reported ('whole_frame': later batches run segments) and this batch runs
eagerly over its staged ranges. Without ``capture`` (CPU) the same function runs eagerly: the
CPU tests check the staging order the GPU captures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TYPE_CHECKING

import torch

from .captured import CapturedCall
from .segments import batch_key, BatchHost, CONSTANT_INPUTS, layer_loop, segments
from ..cache.kv_pool import KVPool
from ..cache.planned import planned
from ..cache.staged_frames import StagedFrames
from ..cache.staged_runs import joint_kernel, RunsKernel, StagedRuns
from ..model.aggregator import Aggregator
from ..profiling import step_range

if TYPE_CHECKING:
    from .jobs import Job
    from ..attention.staged import StagedKey

FallBack = Callable[[BaseException], None]
"""Reports a whole-batch capture that failed (the runner steps down to segments)."""


class WholeBatches:
    """The staged slots over one pool and the whole-batch graphs captured on them.

    Args:
        pool: the pool whose streams' frames run.
        capture: capture CUDA graphs (CUDA only); False runs each batch eagerly.
        compile_merge: let the staged attention compile its merge (``StagedFrames``).
    """

    def __init__(self, pool: KVPool, capture: bool, compile_merge: bool = False) -> None:
        self.pool = pool
        self._capture = capture
        self._compile_merge = compile_merge
        self._slots: list[StagedFrames] = []
        self._graphs: dict[Any, CapturedCall] = {}
        self.batches = 0
        """Batches run whole (replayed, captured or eager)."""

    @property
    def captured(self) -> int:
        """Return the batch graphs captured so far."""
        return len(self._graphs)

    @property
    def keys(self) -> tuple:
        """Return the keys of the graphs captured so far (``segments.BatchKey``)."""
        return tuple(self._graphs)

    def slots_for(self, count: int) -> list[StagedFrames]:
        """Return slots 0 .. count-1, each built and warmed up once (outside any capture).

        Raises:
            CacheStateError: the pool's backend supplies no capturable attention.
        """
        pool = self.pool
        while len(self._slots) < count:
            slot = StagedFrames(pool, self._compile_merge)
            heads, dim = pool.storage.k[0].shape[2:]
            slot.warm_up(torch.zeros(pool.tokens_per_frame, heads, dim, dtype=pool.dtype,
                                     device=pool.device))
            self._slots.append(slot)
        return self._slots[:count]

    def run(self, agg: Aggregator, host: BatchHost, images: torch.Tensor, jobs: Sequence[Job],
            patch_hw: tuple[int, int], fall_back: FallBack) -> tuple[torch.Tensor, ...]:
        """Run the batch: stage every job's frame, one graph (or eager run), finish them.

        A failure anywhere rolls every job's frame back (``planned``). The slots must have
        been built (:meth:`slots_for`).

        Returns:
            ``(dino, *taps)``, fresh tensors, row b for ``jobs[b]``.
        """
        slots = self._slots[:len(jobs)]
        work = [_timed(slot.staging(job.stream.kv, job.mode == 'keyframe'))
                for slot, job in zip(slots, jobs)]
        with planned(work) as keys, step_range('batch graph'):
            out = self._outputs(agg, host, images, jobs, patch_hw, slots, tuple(keys),
                                fall_back)
        self.batches += 1
        return out

    def prepare_full_window(self, agg: Aggregator, host: BatchHost, images: torch.Tensor,
                            job: Job, patch_hw: tuple[int, int], fall_back: FallBack) -> None:
        """Capture the full-window graphs of a batch of one on ``job``'s lease now.

        Writes placeholder keys into that stream's pages (the table is not touched): the
        caller resets it before real frames. A capture that fails is reported.
        """
        if not self._capture:
            return
        slot = self.slots_for(1)[0]
        for keyframe in (True, False):
            key = slot.stage_placeholder(job.stream.kv, keyframe)
            if not self._graph(agg, host, images, [job], patch_hw, [slot], (key,), fall_back,
                               joint_kernel([slot], (key,))):
                return

    def _outputs(self, agg: Aggregator, host: BatchHost, images: torch.Tensor,
                 jobs: Sequence[Job], patch_hw: tuple[int, int],
                 slots: Sequence[StagedFrames], keys: tuple[StagedKey, ...],
                 fall_back: FallBack) -> tuple[torch.Tensor, ...]:
        with step_range('batch inputs'):
            inputs = host.inputs(images, jobs, patch_hw)
        kv_dtype = self.pool.dtype
        joint = joint_kernel(slots, keys)
        if not self._capture:
            return staged_layers(agg, host, kv_dtype, slots, keys, joint, *inputs)
        call = self._graph(agg, host, images, jobs, patch_hw, slots, keys, fall_back, joint,
                           inputs)
        if call is None:
            # The frames are staged: run them eagerly, each over its staged run as one range
            # (no split: cuDNN is the likeliest culprit), making the writes the failed
            # warm-up made.
            ranges = tuple(('range',) for _ in keys)
            return staged_layers(agg, host, kv_dtype, slots, ranges, None, *inputs)
        return call(*inputs)

    def _graph(self, agg: Aggregator, host: BatchHost, images: torch.Tensor,
               jobs: Sequence[Job], patch_hw: tuple[int, int], slots: Sequence[StagedFrames],
               keys: tuple[StagedKey, ...], fall_back: FallBack, joint: Any,
               inputs: tuple[torch.Tensor, ...] | None = None) -> CapturedCall | None:
        """Return the graph of this batch's key, captured on first use; None if it fails.

        ``joint``: ``joint_kernel(slots, keys)``, read once per batch by the caller.
        """
        kv_dtype = self.pool.dtype
        key = batch_key(agg, images, kv_dtype, host.bodies.compiled, keys + (joint is not None,))
        call = self._graphs.get(key)
        if call is not None:
            return call
        if inputs is None:
            inputs = host.inputs(images, jobs, patch_hw)

        def fn(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return staged_layers(agg, host, kv_dtype, slots, keys, joint, *tensors)
        try:
            call = CapturedCall(fn, inputs, True, pool=host.graph_pool(),
                                constant=CONSTANT_INPUTS)
        except Exception as exc:  # noqa: BLE001 - capture raises many kinds
            self._graphs.clear()
            fall_back(exc)
            return None
        self._graphs[key] = call
        return call


def _timed(work: tuple[Callable[[], StagedKey], Callable[[StagedKey, bool], None]]
           ) -> tuple[Callable[[], StagedKey], Callable[[StagedKey, bool], None]]:
    """``work`` with its begin and end in the 'stage' and 'unstage' step ranges."""
    begin, end = work

    def staged() -> StagedKey:
        with step_range('stage'):
            return begin()

    def unstaged(key: StagedKey, failed: bool) -> None:
        with step_range('unstage'):
            end(key, failed)
    return staged, unstaged


def staged_layers(agg: Aggregator, host: BatchHost, kv_dtype: torch.dtype,
                  slots: Sequence[StagedFrames], keys: Sequence[StagedKey],
                  joint: RunsKernel | None, images: torch.Tensor, specials: torch.Tensor,
                  *tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Run the batch's segments, slot b's staged write + attention per global block (capturable).

    With ``joint`` (``staged_runs.joint_kernel``) every slot's write and attention of a block
    go at once (``StagedRuns``); otherwise slot by slot, on the lanes.

    Returns:
        ``(dino, *taps)``.
    """
    runs = None if joint is None else StagedRuns(slots, joint)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if runs is not None:
            # [B, H, P, D] views of token-major [B, P, H, D] tensors (segments.py).
            tq, tk, tv = (t.transpose(1, 2) for t in (q, k, v))
            return runs.run(layer, tq, tk, tv).transpose(1, 2)

        def slot_work(b: int) -> Callable[[], torch.Tensor]:
            # Row b of the token-major views is the contiguous [P, H, D] the cache takes.
            def work() -> torch.Tensor:
                slots[b].write(layer, k[b].transpose(0, 1), v[b].transpose(0, 1))
                return slots[b].attend(layer, keys[b], q[b].transpose(0, 1))
            return work

        # Independent slots: each on a side stream (parallel branches of the graph).
        outs = host.lanes.run(q.device, [slot_work(b) for b in range(len(slots))])
        o = outs[0][None] if len(outs) == 1 else torch.stack(outs)
        return o.transpose(1, 2)

    def run(index: int, fn: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return host.run_eager(fn, *inputs)

    return layer_loop(agg, segments(agg, host, kv_dtype), run, attend, images, specials,
                      tables)
