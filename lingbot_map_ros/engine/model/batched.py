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
"""The aggregator's layer loop over one streaming frame of each of B streams, as one batch.

Dims: B streams (one frame each), P tokens per frame, C embed dim, H heads of D dims.

Everything a frame does on its own runs once for the B frames: DINO, the special tokens, the
frame blocks, the global blocks' QKV projection, output projection and MLP, the taps. What
reads a stream's state stays per stream: each global block's attention goes through that
stream's own pages (``StreamKV.write`` / ``attend`` with its own plan), and each frame rotates
with its own 3-D RoPE time index. Frame i of the batch therefore computes what the stream's
single-frame call (``Aggregator.run``) computes, on the same kernels; only the GEMMs see B*P
rows instead of P.

The calls must have passed ``Aggregator.prepare`` (the caller isolates a refused frame there).
The cache work is planned for every stream before the first layer and ended after the last;
when the loop raises, every stream's frame is rolled back (``StreamKV.end_frame(failed=True)``).

The fixed-shape work between two cache attentions is one segment (``batch_layers.py``: the
segments, the batch's inputs and the loop over the blocks). :class:`BatchGraphs` replays each
segment as a CUDA graph per batch shape, captured the first time that shape runs; without it
(CPU, fast path off, a failed capture) the same segment functions run eagerly, so the CPU tests
check the segmentation the GPU replays. Where the engine runs whole frames and the pool can
stage, the whole batch, segments and every stream's cache attention, is one CUDA graph instead
(``whole_batch.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import logging
from typing import Any

import torch

from .aggregator import Aggregator, AggregatorOutput
from .batch_layers import batch_inputs, BatchCall, layer_loop, Segment, segments, shape_key
from .captured import CapturedCall
from .graphed import Bodies
from .lanes import Lanes
from .whole_batch import WholeBatches
from ..cache.kv_pool import KVPool
from ..cache.staged_frames import can_stage
from ..cache.stream_kv import FramePlan

_LOG = logging.getLogger(__name__)


class BatchGraphs:
    """The batched frames' CUDA graphs (engine-wide): segments per batch shape, or whole batches.

    Args:
        capture: replay captured graphs (CUDA); otherwise run the same functions eagerly.
        on_fallback: told of a capture that fails (the engine counts it as 'batch_capture').
        staged: run whole batches over the staged cache where the pool can stage (the engine's
            fast path is 'whole_frame'); on the CPU they run eagerly.
        compile_bodies: ``torch.compile`` the segment bodies (and the staged merge) first.
        lanes: run the per-stream work on side streams (``cache.kernel.lanes``).
    """

    def __init__(self, capture: bool,
                 on_fallback: Callable[[BaseException], None] | None = None,
                 staged: bool = False, compile_bodies: bool = False,
                 lanes: bool = True) -> None:
        self.capture = capture
        self.staged = staged
        self.bodies = Bodies(compile_bodies)
        """The segment bodies every batch runs (plain after a failure)."""
        self._compile = compile_bodies
        self._on_fallback = on_fallback
        self._pool: Any = None
        self._sets: dict[tuple, list[CapturedCall]] = {}
        self._whole: WholeBatches | None = None  # of the latest pool
        self.lanes = Lanes(lanes)
        """Side streams of the per-stream work (cache attentions, camera heads): ``lanes.py``."""

    @property
    def captured(self) -> int:
        """Return the segments captured so far, over every batch shape."""
        return sum(len(replays) for replays in self._sets.values())

    @property
    def whole_captured(self) -> int:
        """Return the whole-batch graphs captured so far (every shape and staged key)."""
        return 0 if self._whole is None else self._whole.captured

    @property
    def whole(self) -> WholeBatches | None:
        """Return the whole batches of the latest pool; None before any (or after a failure)."""
        return self._whole

    def graph_pool(self) -> Any:
        """Return the memory pool the batches' graphs share (made on first use)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def whole_for(self, pool: KVPool) -> WholeBatches | None:
        """Return the whole batches over ``pool``, or None: the batch runs segments."""
        if not self.staged or not can_stage(pool):
            return None
        if self._whole is None or self._whole.pool is not pool:
            self._whole = None  # release the old pool's graphs first
            self._whole = WholeBatches(pool, self.capture, self._compile)
        return self._whole

    def give_up(self, exc: BaseException, whole: bool) -> None:
        """Report a failed capture; step down to segments (``whole``) or to eager segments.

        Either way the bodies run uncompiled from now on (the failure may be Inductor's).
        """
        if self._on_fallback is not None:
            self._on_fallback(exc)  # counted and logged once by the engine
        else:
            _LOG.warning('CUDA graphs of batched frames unavailable; stepping down (%s: %s)',
                         type(exc).__name__, exc)
        self.bodies = Bodies(False)
        self._compile = False
        self.staged = False
        self._whole = None
        if not whole:
            self.capture = False
            self._sets.clear()

    def run(self, key: tuple, index: int, fn: Segment,
            *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run segment ``index`` of the batch shape ``key`` on ``inputs``.

        Captured the first time (segments are built in order); a capture that fails turns
        capture off for good (:meth:`give_up`) and the segment runs eagerly.
        """
        if not self.capture:
            return fn(*inputs)
        replays = self._sets.setdefault(key, [])
        if index == len(replays):
            try:
                replays.append(CapturedCall(fn, inputs, True, pool=self.graph_pool()))
            except Exception as exc:  # noqa: BLE001 - capture raises many kinds
                self.give_up(exc, whole=False)
                return fn(*inputs)
        return replays[index](*inputs)


def run_batched(agg: Aggregator, images: torch.Tensor, calls: Sequence[BatchCall],
                patch_hw: tuple[int, int], graphs: BatchGraphs | None = None
                ) -> AggregatorOutput:
    """Run the frames ``images`` [B, 3, H, W] of ``calls`` (one per stream) through ``agg``.

    Args:
        agg: the aggregator.
        images: row b is ``calls[b]``'s frame.
        calls: the streams' calls, each accepted by ``Aggregator.prepare``.
        patch_hw: the (h, w) patch grid.
        graphs: the engine's captured batches; None runs the segments eagerly.

    Returns:
        The B frames' taps ([B, P, 2C] each) and DINO tokens, row b for ``calls[b]``.

    Raises:
        ValueError: a scale call, or a stream twice in the batch.
    """
    if any(call.mode == 'scale' for call in calls):
        raise ValueError('a scale pass does not batch across streams')
    if len({id(call.kv) for call in calls}) != len(calls):
        raise ValueError('a stream appears twice in one batch')
    graphs = graphs or BatchGraphs(False)
    whole = graphs.whole_for(calls[0].kv.pool)
    outputs = None if whole is None else whole.run(agg, graphs, images, calls, patch_hw)
    if outputs is not None:
        dino, *taps = outputs
        return AggregatorOutput(taps=list(taps), dino_tokens=dino, patch_hw=patch_hw)
    plans: list[FramePlan] = []
    try:
        for call in calls:
            plans.append(call.kv.plan_frame(call.mode, 1))
        out = _layers(agg, images, calls, plans, patch_hw, graphs)
    except BaseException:
        for call, plan in zip(calls, plans):
            call.kv.end_frame(plan, failed=True)
        raise
    for call, plan in zip(calls, plans):
        call.kv.end_frame(plan)
    return out


def _layers(agg: Aggregator, images: torch.Tensor, calls: Sequence[BatchCall],
            plans: Sequence[FramePlan], patch_hw: tuple[int, int],
            graphs: BatchGraphs) -> AggregatorOutput:
    """Segments (replayed or eager), each stream's cache attention eager between them."""
    kv_dtype = calls[0].kv.dtype
    key = shape_key(agg, images, kv_dtype)
    specials, *tables = batch_inputs(agg, images, calls, patch_hw)

    def run(index: int, fn: Segment, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return graphs.run(key, index, fn, *inputs)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([agg.global_attention(layer, call.kv, plan)(q[j:j + 1], k[j:j + 1],
                                                                     v[j:j + 1])
                          for j, (call, plan) in enumerate(zip(calls, plans))])

    dino, *taps = layer_loop(agg, segments(agg, graphs, kv_dtype), run, attend, images,
                             specials, tables)
    return AggregatorOutput(taps=list(taps), dino_tokens=dino, patch_hw=patch_hw)
