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

The fixed-shape work between two cache attentions is one segment, as in ``graphed.py``
(seg 0: DINO, specials, frame block 0, global block 0 up to q, k, v; seg i: the rest of global
block i-1, frame block i, global block i up to q, k, v; seg L: the rest of the last global
block). :class:`BatchGraphs` replays each segment as a CUDA graph per batch shape, captured
the first time that shape runs; without it (CPU, fast path off, a failed capture) the same
segment functions run eagerly, so the CPU tests check the segmentation the GPU replays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
import logging
from typing import Any

import torch

from .aggregator import (Aggregator, AggregatorOutput, frame_step, global_finish, global_qkv,
                         tap_features, with_specials)
from .captured import capture_graph
from .layers import wide_dtype
from ..cache.stream_kv import FramePlan, StreamKV
from ..frames import Role

_LOG = logging.getLogger(__name__)
Segment = Callable[..., tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class BatchCall:
    """One stream's frame in a batch."""

    kv: StreamKV
    """The stream's KV cache (its pages of the engine pool)."""
    time_index: int
    """3-D RoPE time of the frame (keyframes the stream cached so far)."""
    mode: Role
    """'keyframe' or 'non-keyframe' (a scale pass never batches)."""


class BatchGraphs:
    """The segments of batched frames as CUDA graphs, one set per batch shape (engine-wide)."""

    def __init__(self, capture: bool,
                 on_fallback: Callable[[BaseException], None] | None = None) -> None:
        """Replay captured segments when ``capture`` (CUDA); otherwise run them eagerly.

        ``on_fallback`` is told of a capture that fails (the engine counts it).
        """
        self.capture = capture
        self._on_fallback = on_fallback
        self._pool: Any = None
        self._sets: dict[tuple, list[_Replay]] = {}

    @property
    def captured(self) -> int:
        """Return the segments captured so far, over every batch shape."""
        return sum(len(replays) for replays in self._sets.values())

    def run(self, key: tuple, index: int, fn: Segment,
            *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run segment ``index`` of the batch shape ``key`` on ``inputs``.

        Captured the first time (segments are built in order); a capture that fails turns
        capture off for good, logged once, and the segment runs eagerly.
        """
        if not self.capture:
            return fn(*inputs)
        replays = self._sets.setdefault(key, [])
        if index == len(replays):
            try:
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                replays.append(_Replay(fn, inputs, self._pool))
            except Exception as exc:  # noqa: BLE001 - capture raises many kinds
                if self._on_fallback is not None:
                    self._on_fallback(exc)  # counted and logged once by the engine
                else:
                    _LOG.warning('CUDA graphs of batched frames unavailable; running them '
                                 'eagerly (%s: %s)', type(exc).__name__, exc)
                self.capture = False
                self._sets.clear()
                return fn(*inputs)
        return replays[index](*inputs)


class _Replay:
    """One captured segment: inputs copied into static buffers, outputs cloned."""

    def __init__(self, fn: Segment, inputs: Sequence[torch.Tensor], pool: Any) -> None:
        self._static = [t.detach().clone() for t in inputs]
        self._graph, self._outputs = capture_graph(lambda: fn(*self._static), pool)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for static, value in zip(self._static, inputs):
            static.copy_(value)
        self._graph.replay()
        return tuple(out.clone() for out in self._outputs)


def run_batched(agg: Aggregator, images: torch.Tensor, calls: Sequence[BatchCall],
                patch_hw: tuple[int, int], graphs: BatchGraphs | None = None
                ) -> AggregatorOutput:
    """Run the frames ``images`` [B, 3, H, W] of ``calls`` (one per stream) through ``agg``.

    Args:
        agg: the aggregator.
        images: row b is ``calls[b]``'s frame.
        calls: the streams' calls, each accepted by ``Aggregator.prepare``.
        patch_hw: the (h, w) patch grid.
        graphs: the engine's captured segments; None runs them eagerly.

    Returns:
        The B frames' taps ([B, P, 2C] each) and DINO tokens, row b for ``calls[b]``.

    Raises:
        ValueError: a scale call, or a stream twice in the batch.
    """
    if any(call.mode == 'scale' for call in calls):
        raise ValueError('a scale pass does not batch across streams')
    if len({id(call.kv) for call in calls}) != len(calls):
        raise ValueError('a stream appears twice in one batch')
    plans: list[FramePlan] = []
    try:
        for call in calls:
            plans.append(call.kv.plan_frame(call.mode, 1))
        out = _layers(agg, images, calls, plans, patch_hw, graphs or BatchGraphs(False))
    except BaseException:
        for call, plan in zip(calls, plans):
            call.kv.end_frame(plan, failed=True)
        raise
    for call, plan in zip(calls, plans):
        call.kv.end_frame(plan)
    return out


def _token_major(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Return ``t`` [B, H, N, D] in ``dtype``, as a view of a contiguous [B, N, H, D].

    Row b's ``[0].transpose(0, 1)`` is then the contiguous [N, H, D] the cache takes (no copy).
    """
    return t.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format).transpose(1, 2)


def _frame_qkv(agg: Aggregator, i: int, x: torch.Tensor, kv_dtype: torch.dtype,
               *tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
    frame_cos, frame_sin, video_cos, video_sin = tables
    frame_out = frame_step(agg.frame_blocks[i], x, frame_cos, frame_sin)
    q, k, v = global_qkv(agg.global_blocks[i], frame_out, video_cos, video_sin)
    return frame_out, _token_major(q, kv_dtype), _token_major(k, kv_dtype), \
        _token_major(v, kv_dtype)


def _segments(agg: Aggregator, kv_dtype: torch.dtype) -> list[Segment]:
    """Return the L + 1 segment functions (module docstring)."""
    depth = agg.config.depth

    def first(images: torch.Tensor, specials: torch.Tensor,
              *tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
        trunk = agg.patch_embed
        x = trunk.embed(agg.normalize(images))
        for block in trunk.blocks:
            x = block(x)
        dino = trunk.finish(x)
        return (dino,) + _frame_qkv(agg, 0, with_specials(specials, dino), kv_dtype, *tables)

    def middle(i: int) -> Segment:
        def segment(frame_out: torch.Tensor, o: torch.Tensor,
                    *tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
            x = global_finish(agg.global_blocks[i - 1], frame_out, o)
            return (x,) + _frame_qkv(agg, i, x, kv_dtype, *tables)
        return segment

    def last(frame_out: torch.Tensor, o: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (global_finish(agg.global_blocks[depth - 1], frame_out, o),)

    return [first] + [middle(i) for i in range(1, depth)] + [last]


def _layers(agg: Aggregator, images: torch.Tensor, calls: Sequence[BatchCall],
            plans: Sequence[FramePlan], patch_hw: tuple[int, int],
            graphs: BatchGraphs) -> AggregatorOutput:
    h, w = patch_hw
    b, depth = images.shape[0], agg.config.depth
    kv_dtype = calls[0].kv.dtype
    weights = agg.camera_token
    key = (tuple(images.shape), images.dtype, images.device, kv_dtype, weights.dtype,
           weights.data_ptr())
    # Streaming frames all take variant 1 of every special token, keyframe or not.
    specials = agg.special_tokens(b, 'keyframe', weights.dtype)
    rope_dtype = wide_dtype(weights.dtype)
    frame_cos, frame_sin = agg.frame_rope.tables(h, w, images.device, rope_dtype)
    # Each frame's own time index: [B, 1, P, D/2] tables broadcast over the heads.
    video = [agg.video_rope.tables(call.time_index, 1, h, w, images.device, rope_dtype)
             for call in calls]
    tables = (frame_cos, frame_sin, torch.stack([cos for cos, _ in video])[:, None],
              torch.stack([sin for _, sin in video])[:, None])
    segments = _segments(agg, kv_dtype)
    dino, frame_out, q, k, v = graphs.run(key, 0, segments[0], images, specials, *tables)
    taps = []
    for i in range(1, depth + 1):
        o = torch.cat([agg.global_attention(i - 1, call.kv, plan)(q[j:j + 1], k[j:j + 1],
                                                                  v[j:j + 1])
                       for j, (call, plan) in enumerate(zip(calls, plans))])
        if i < depth:
            x, next_out, q, k, v = graphs.run(key, i, segments[i], frame_out, o, *tables)
        else:
            (x,), next_out = graphs.run(key, i, segments[i], frame_out, o), frame_out
        if i - 1 in agg.config.tap_layers:
            taps.append(tap_features(frame_out, x))
        frame_out = next_out
    return AggregatorOutput(taps=taps, dino_tokens=dino, patch_hw=(h, w))
