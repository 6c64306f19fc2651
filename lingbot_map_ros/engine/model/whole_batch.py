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
"""A batch of B streams' frames as one CUDA graph: batched segments, staged cache attention.

Dims: B streams (one frame each), P tokens per frame, H heads of D dims.

Why: replaying the batch's segments one by one leaves each stream's 24 cache attentions to be
issued from Python between them, with their page bookkeeping, B times per layer: a batch of
two so run takes as long as two single frames, each of which is one graph (whole frames,
``graphed.py``; docs/performance.md, 'Batches of cameras'). Here the batch is one graph as
well: the segments of ``batched.py`` run on the B*P rows and, per global block, each stream's
K/V is written and attended through its own :class:`StagedFrames` (slot b of the batch
stages the frame of ``calls[b]``; all slots are views of the one pool and independent: each
keeps its own write index and visible run).
Being independent, the B slots' writes and attentions of a block run on side streams
(``lanes.py``): the graph holds them as parallel branches, joined before the next segment.
Where the backend attends several runs in one call (``fa3``), they are one write and one
launch instead (``cache/staged_runs.py``), and the graph key says which form it holds.

A graph is keyed by the batch's shape, dtypes, weights and the B staged keys (window filling,
or the split of a full window, which fixes where that stream's patch run lies); it is captured
on first use like a whole frame (``capture_graph``: one run on the staged numbers, then the
capture). That first run makes every slot's cache writes exactly as the replay does, so a live
batch can trigger it. A capture that fails is reported (``BatchGraphs.give_up``: counted as
'batch_capture', later batches replay segments) and this batch runs eagerly over the staged
ranges. Without ``capture`` (CPU) the same function runs eagerly: the CPU tests check the
staging order the GPU captures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TYPE_CHECKING

import torch

from .aggregator import Aggregator
from .batch_layers import batch_inputs, BatchCall, BatchHost, layer_loop, segments, shape_key
from .captured import CapturedCall
from ..cache.kv_pool import KVPool
from ..cache.staged_frames import StagedFrames
from ..cache.staged_runs import joint_kernel, RunsKernel, StagedRuns
from ..profiling import step_range

if TYPE_CHECKING:
    from ..attention.staged import StagedKey


class WholeBatches:
    """The staged slots over one pool and the whole-batch graphs captured on them.

    Args:
        pool: the pool whose streams' frames are batched.
        capture: capture CUDA graphs (CUDA only); False runs each batch eagerly.
        compile_merge: let the staged attention compile its merge (``StagedFrames``).
    """

    def __init__(self, pool: KVPool, capture: bool, compile_merge: bool = False) -> None:
        self.pool = pool
        self._capture = capture
        self._compile_merge = compile_merge
        self._slots: list[StagedFrames] = []
        self._graphs: dict[tuple, CapturedCall] = {}
        self.batches = 0
        """Batches run whole (replayed, captured or eager)."""

    @property
    def captured(self) -> int:
        """Return the batch graphs captured so far."""
        return len(self._graphs)

    def _slots_for(self, count: int) -> list[StagedFrames]:
        """Return slots 0 .. count-1, each built and warmed up once (outside any capture)."""
        pool = self.pool
        while len(self._slots) < count:
            slot = StagedFrames(pool, self._compile_merge)
            heads, dim = pool.storage.k[0].shape[2:]
            slot.warm_up(torch.zeros(pool.tokens_per_frame, heads, dim, dtype=pool.dtype,
                                     device=pool.device))
            self._slots.append(slot)
        return self._slots[:count]

    def run(self, agg: Aggregator, graphs: BatchHost, images: torch.Tensor,
            calls: Sequence[BatchCall],
            patch_hw: tuple[int, int]) -> tuple[torch.Tensor, ...] | None:
        """Run the batch: stage every stream's frame, one graph (or eager run), finish them.

        A failure anywhere rolls every stream's frame back (``StagedFrames.finish``).

        Returns:
            ``(dino, *taps)``, fresh tensors, row b for ``calls[b]``; None, reported, when
            the slots cannot be built (nothing staged: the caller runs segments).
        """
        try:
            slots = self._slots_for(len(calls))
        except Exception as exc:  # noqa: BLE001 - Inductor/Triton raise many kinds
            graphs.give_up(exc, whole=True)
            return None
        keys: list[StagedKey] = []
        try:
            with step_range('stage'):
                for slot, call in zip(slots, calls):
                    keys.append(slot.stage_frame(call.kv, call.mode == 'keyframe'))
            with step_range('batch graph'):
                out = self._outputs(agg, graphs, images, calls, patch_hw, slots, tuple(keys))
        except BaseException:
            for slot in slots[:len(keys)]:
                slot.finish(failed=True)
            raise
        with step_range('unstage'):
            for slot in slots:
                slot.finish()
        self.batches += 1
        return out

    def _outputs(self, agg: Aggregator, graphs: BatchHost, images: torch.Tensor,
                 calls: Sequence[BatchCall], patch_hw: tuple[int, int],
                 slots: Sequence[StagedFrames],
                 keys: tuple[StagedKey, ...]) -> tuple[torch.Tensor, ...]:
        with step_range('batch inputs'):
            inputs = (images, *batch_inputs(agg, images, calls, patch_hw))
        kv_dtype = self.pool.dtype
        joint = joint_kernel(slots, keys)
        if not self._capture:
            return staged_layers(agg, graphs, kv_dtype, slots, keys, joint, *inputs)
        key = shape_key(agg, images, kv_dtype) + keys + (joint is not None,)
        call = self._graphs.get(key)
        if call is None:
            def fn(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
                return staged_layers(agg, graphs, kv_dtype, slots, keys, joint, *tensors)
            try:
                call = CapturedCall(fn, inputs, True, pool=graphs.graph_pool())
            except Exception as exc:  # noqa: BLE001 - capture raises many kinds
                # The frames are staged: run them eagerly, each over its staged run as one
                # range (no split: cuDNN is the likeliest culprit), making the writes the
                # failed warm-up made.
                graphs.give_up(exc, whole=True)
                ranges = tuple(('range',) for _ in keys)
                return staged_layers(agg, graphs, kv_dtype, slots, ranges, None, *inputs)
            self._graphs[key] = call
        return call(*inputs)


def staged_layers(agg: Aggregator, graphs: BatchHost, kv_dtype: torch.dtype,
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
            # [B, H, P, D] views of token-major [B, P, H, D] tensors (graphed.py).
            tq, tk, tv = (t.transpose(1, 2) for t in (q, k, v))
            return runs.run(layer, tq, tk, tv).transpose(1, 2)

        def slot_work(b: int) -> Callable[[], torch.Tensor]:
            # Row b of the token-major views is the contiguous [P, H, D] the cache takes.
            def work() -> torch.Tensor:
                slots[b].write(layer, k[b].transpose(0, 1), v[b].transpose(0, 1))
                return slots[b].attend(layer, keys[b], q[b].transpose(0, 1))
            return work

        # Independent slots: each on a side stream (parallel branches of the graph).
        outs = graphs.lanes.run(q.device, [slot_work(b) for b in range(len(slots))])
        return torch.stack(outs).transpose(1, 2)

    def run(index: int, fn: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return fn(*inputs)

    return layer_loop(agg, segments(agg, graphs, kv_dtype), run, attend, images, specials,
                      tables)
