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
"""Segments: a batch's fixed-shape work between two cache attentions, and the one layer loop.

Dims: B jobs (one streaming frame each, B = 1 for a single frame), P = 6 + h*w tokens per
frame, C embed dim, H heads of D dims, L = depth.

Why: a streaming frame of the official model launches thousands of small kernels (LayerNorms,
casts, GEMMs, RoPE, residual adds). Issued one by one from Python they cost far more host time
than the GPU needs to run them (docs/performance.md, 'CUDA graphs'). Everything except the
cross-frame attention has fixed shapes for a batch size and resolution, so it is captured once
and replayed; only the paged-cache attention (whose key count changes every frame) sits between.

Segments (``g`` = global block, ``f`` = frame block)::

    seg 0      image -> normalise -> DINO -> [specials | patches] -> f0 -> g0 up to (q, k, v)
    seg i      o_{i-1} -> rest of g_{i-1} (proj, LayerScale, MLP) -> f_i -> g_i up to (q, k, v)
    seg L      o_{L-1} -> rest of g_{L-1}
    between    o_i = cache attention of g_i over (q_i, k_i, v_i), per job's stream

The segments are compositions of the aggregator's per-layer steps (``model/aggregator.py``:
``frame_step``, ``global_qkv``, ``global_finish``, ``tap_features``), the steps its eager loop
runs, so the results are the same. :func:`layer_loop` is the runner's one loop over them; how
a segment runs (replayed or eager) and how the cache attention goes (eager per stream, or
staged inside a whole-batch graph: ``whole_batch.py``) is the caller's (``batch_runs.py``).

With ``compile_bodies`` the segment bodies go through ``torch.compile`` (Inductor) first: with
the host time gone, much of a frame's GPU time is small memory-bound kernels that Inductor
fuses (docs/performance.md, 'torch.compile of the segments'). The bodies are module-level
functions taking the blocks as arguments, so one compiled graph serves every block of a kind
(four compilations per shape: DINO block, first tail, middle, last).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TYPE_CHECKING

import torch

from .captured import maybe_compile
from .lanes import Lanes
from ..model.aggregator import (Aggregator, frame_step, global_finish, global_qkv, tap_features,
                                with_specials)
from ..model.layers import Block, wide_dtype

if TYPE_CHECKING:
    from .jobs import Job
    from ..model.dino import DinoTrunk

Segment = Callable[..., tuple[torch.Tensor, ...]]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""Global block i's cache attention of the batch: ``(i, q, k, v) -> o`` ([B, H, P, D] each)."""
RunSegment = Callable[..., tuple[torch.Tensor, ...]]
"""``(index, segment, *inputs) -> outputs``: a segment run eagerly or replayed."""


def _token_major(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, H, N, D] -> the same values in ``dtype``, a view of a contiguous [B, N, H, D] tensor.

    The cache stores and attends token-major [N, H, D]: producing that layout here (fused into
    the RoPE kernel when compiled, inside the graph either way) leaves the cache path no
    relayout copies (row b's ``[b].transpose(0, 1)`` is contiguous).
    """
    return t.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format).transpose(1, 2)


def _frame_then_qkv(frame_block: Block, global_block: Block, x: torch.Tensor,
                    frame_cos: torch.Tensor, frame_sin: torch.Tensor, video_cos: torch.Tensor,
                    video_sin: torch.Tensor, kv_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Frame block, then the global block up to its rotated q, k, v (token-major, KV dtype)."""
    x = frame_step(frame_block, x, frame_cos, frame_sin)
    q, k, v = global_qkv(global_block, x, video_cos, video_sin)
    return x, _token_major(q, kv_dtype), _token_major(k, kv_dtype), _token_major(v, kv_dtype)


def _dino_block(block: Block, x: torch.Tensor) -> torch.Tensor:
    return block(x)


def _first_tail(trunk: DinoTrunk, x: torch.Tensor, specials: torch.Tensor, frame_block: Block,
                global_block: Block, *tables: Any) -> tuple[torch.Tensor, ...]:
    """End of DINO, special tokens prepended, then frame block 0 and global block 0's q, k, v."""
    dino = trunk.finish(x)
    x = with_specials(specials, dino)
    return (dino,) + _frame_then_qkv(frame_block, global_block, x, *tables)


def _middle(prev_global: Block, frame_block: Block, global_block: Block, frame_out: torch.Tensor,
            o: torch.Tensor, *tables: Any) -> tuple[torch.Tensor, ...]:
    """Rest of global block i-1, frame block i, global block i up to q, k, v."""
    x = global_finish(prev_global, frame_out, o)
    return (x,) + _frame_then_qkv(frame_block, global_block, x, *tables)


class Bodies:
    """The segment bodies, plain or compiled once each (shared by every segment of a kind)."""

    def __init__(self, compile_bodies: bool) -> None:
        self.compiled = compile_bodies
        self.dino_block = maybe_compile(_dino_block, compile_bodies)
        self.first_tail = maybe_compile(_first_tail, compile_bodies)
        self.middle = maybe_compile(_middle, compile_bodies)
        self.last = maybe_compile(global_finish, compile_bodies)


class BatchHost(Protocol):
    """What a batch's segments and whole batches use of the runner (``batch_runs.py``)."""

    bodies: Bodies
    """The segment bodies (read when a segment runs: plain ones after a failed compile)."""
    lanes: Lanes
    """Side streams of the per-stream work."""

    def graph_pool(self) -> Any:
        """Return the memory pool the batches' graphs share."""

    def run_eager(self, fn: Segment, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run a segment now, stepping a failed compiled body down to the plain one."""

    def inputs(self, images: torch.Tensor, jobs: Sequence[Job],
               patch_hw: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        """Return the images and the batch's ``batch_inputs``, the constant ones kept."""


@dataclass(frozen=True)
class BatchKey:
    """What a batch's graphs depend on; a new key captures new graphs (the dispatch key)."""

    shape: tuple[int, ...]
    """The images' shape: batch size and resolution."""
    dtype: torch.dtype
    device: torch.device
    kv_dtype: torch.dtype
    weight_dtype: torch.dtype
    weights_ptr: int
    """Storage of the aggregator's weights: moving the module re-allocates what graphs read."""
    compiled: bool
    """The bodies the graphs were captured with."""
    staged: tuple = ()
    """Whole batches: each job's staged key and whether the slots attend jointly."""


def batch_key(agg: Aggregator, images: torch.Tensor, kv_dtype: torch.dtype, compiled: bool,
              staged: tuple = ()) -> BatchKey:
    """Return the dispatch key of a batch of ``images`` (see :class:`BatchKey`)."""
    weights = agg.camera_token
    return BatchKey(tuple(images.shape), images.dtype, images.device, kv_dtype, weights.dtype,
                    weights.data_ptr(), compiled, staged)


def batch_inputs(agg: Aggregator, images: torch.Tensor, jobs: Sequence[Job],
                 patch_hw: tuple[int, int], specials: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Return the batch's inputs besides the images: specials and RoPE tables.

    Args:
        specials: the batch's special tokens (a function of the weights and the batch size
            only: the caller keeps them, ``BatchRuns.inputs``).

    Returns:
        ``(specials, frame_cos, frame_sin, video_cos, video_sin)``; the video tables are
        [B, 1, P, D/2], each frame's own time index, broadcast over the heads. The specials
        and the frame tables are the same tensors every call (``CONSTANT_INPUTS``).
    """
    h, w = patch_hw
    weights = agg.camera_token
    rope_dtype = wide_dtype(weights.dtype)
    frame_cos, frame_sin = agg.frame_rope.tables(h, w, images.device, rope_dtype)
    video = [agg.video_rope.tables(job.time_index, 1, h, w, images.device, rope_dtype)
             for job in jobs]
    if len(video) == 1:
        cos, sin = video[0]
        return specials, frame_cos, frame_sin, cos[None, None], sin[None, None]
    return (specials, frame_cos, frame_sin, torch.stack([cos for cos, _ in video])[:, None],
            torch.stack([sin for _, sin in video])[:, None])


CONSTANT_INPUTS = (1, 2, 3)
"""Positions, in the images followed by ``batch_inputs``, of the inputs kept unchanged."""


def segments(agg: Aggregator, host: BatchHost, kv_dtype: torch.dtype) -> list[Segment]:
    """Return the L + 1 segment functions (module docstring) on ``host.bodies``.

    The bodies are read when a segment runs: after a failed compile the eager rerun takes
    the plain ones.
    """
    depth = agg.config.depth

    def first(images: torch.Tensor, specials: torch.Tensor,
              *tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
        bodies, trunk = host.bodies, agg.patch_embed
        x = trunk.embed(agg.normalize(images))
        for block in trunk.blocks:
            x = bodies.dino_block(block, x)
        return bodies.first_tail(trunk, x, specials, agg.frame_blocks[0], agg.global_blocks[0],
                                 *tables, kv_dtype)

    def middle(i: int) -> Segment:
        def segment(frame_out: torch.Tensor, o: torch.Tensor,
                    *tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return host.bodies.middle(agg.global_blocks[i - 1], agg.frame_blocks[i],
                                      agg.global_blocks[i], frame_out, o, *tables, kv_dtype)
        return segment

    def last(frame_out: torch.Tensor, o: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (host.bodies.last(agg.global_blocks[depth - 1], frame_out, o),)

    return [first] + [middle(i) for i in range(1, depth)] + [last]


def layer_loop(agg: Aggregator, parts: Sequence[Segment], run: RunSegment, attend: Attend,
               images: torch.Tensor, specials: torch.Tensor,
               tables: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Run the segments in order with each global block's cache attention between them.

    Returns:
        ``(dino, *taps)``.
    """
    depth = agg.config.depth
    dino, frame_out, q, k, v = run(0, parts[0], images, specials, *tables)
    taps = []
    for i in range(1, depth + 1):
        o = attend(i - 1, q, k, v)
        if i < depth:
            x, next_out, q, k, v = run(i, parts[i], frame_out, o, *tables)
        else:
            (x,), next_out = run(i, parts[i], frame_out, o), frame_out
        if i - 1 in agg.config.tap_layers:
            taps.append(tap_features(frame_out, x))
        frame_out = next_out
    return (dino, *taps)
