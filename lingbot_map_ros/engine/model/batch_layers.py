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
"""The pieces of one streaming frame of each of B streams run as one batch: inputs, segments, loop.

Dims: B streams (one frame each), P tokens per frame, C embed dim, H heads of D dims.

The fixed-shape work between two cache attentions is one segment (seg 0: DINO, specials, frame
block 0, global block 0 up to q, k, v; seg i: the rest of global block i-1, frame block i,
global block i up to q, k, v; seg L: the rest of the last global block; the bodies are
``graphed.py``'s). :func:`layer_loop` runs them in order with each global block's cache
attention between them; how a segment runs (replayed or eager) and how the cache attention
goes (per stream, ``batched.py``; staged, ``whole_batch.py``) is the caller's. Both callers
reach the engine's batch graphs through :class:`BatchHost`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .aggregator import Aggregator, tap_features
from .graphed import Bodies, first_segment
from .lanes import Lanes
from .layers import wide_dtype
from ..cache.stream_kv import StreamKV
from ..frames import Role

Segment = Callable[..., tuple[torch.Tensor, ...]]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""Global block i's cache attention of the batch: ``(i, q, k, v) -> o`` ([B, H, P, D] each)."""
RunSegment = Callable[..., tuple[torch.Tensor, ...]]
"""``(index, segment, *inputs) -> outputs``: a segment run eagerly or replayed."""


class BatchHost(Protocol):
    """What a batch's segments and whole batches use of the engine's ``BatchGraphs``."""

    bodies: Bodies
    """The segment bodies (read when a segment runs: plain ones after a failed capture)."""
    lanes: Lanes
    """Side streams of the per-stream work."""

    def graph_pool(self) -> Any:
        """Return the memory pool the batches' graphs share."""

    def give_up(self, exc: BaseException, whole: bool) -> None:
        """Report a failed capture and step down."""


@dataclass(frozen=True)
class BatchCall:
    """One stream's frame in a batch."""

    kv: StreamKV
    """The stream's KV cache (its pages of the engine pool)."""
    time_index: int
    """3-D RoPE time of the frame (keyframes the stream cached so far)."""
    mode: Role
    """'keyframe' or 'non-keyframe' (a scale pass never batches)."""


def batch_inputs(agg: Aggregator, images: torch.Tensor, calls: Sequence[BatchCall],
                 patch_hw: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """Return the batch's inputs besides the images: specials and RoPE tables.

    Returns:
        ``(specials, frame_cos, frame_sin, video_cos, video_sin)``; the video tables are
        [B, 1, P, D/2], each frame's own time index, broadcast over the heads.
    """
    h, w = patch_hw
    weights = agg.camera_token
    # Streaming frames all take variant 1 of every special token, keyframe or not.
    specials = agg.special_tokens(len(calls), 'keyframe', weights.dtype)
    rope_dtype = wide_dtype(weights.dtype)
    frame_cos, frame_sin = agg.frame_rope.tables(h, w, images.device, rope_dtype)
    video = [agg.video_rope.tables(call.time_index, 1, h, w, images.device, rope_dtype)
             for call in calls]
    return (specials, frame_cos, frame_sin, torch.stack([cos for cos, _ in video])[:, None],
            torch.stack([sin for _, sin in video])[:, None])


def shape_key(agg: Aggregator, images: torch.Tensor, kv_dtype: torch.dtype) -> tuple:
    """Return what a batch's graphs depend on besides the cache: shape, dtypes, weights."""
    weights = agg.camera_token
    return (tuple(images.shape), images.dtype, images.device, kv_dtype, weights.dtype,
            weights.data_ptr())


def segments(agg: Aggregator, graphs: BatchHost, kv_dtype: torch.dtype) -> list[Segment]:
    """Return the L + 1 segment functions (module docstring) on ``graphs.bodies``.

    The bodies are read when a segment runs: after a failed capture the eager rerun takes
    the plain ones.
    """
    depth = agg.config.depth

    def first(images: torch.Tensor, specials: torch.Tensor,
              *tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return first_segment(agg, graphs.bodies, images, specials, *tables, kv_dtype)

    def middle(i: int) -> Segment:
        def segment(frame_out: torch.Tensor, o: torch.Tensor,
                    *tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return graphs.bodies.middle(agg.global_blocks[i - 1], agg.frame_blocks[i],
                                        agg.global_blocks[i], frame_out, o, *tables, kv_dtype)
        return segment

    def last(frame_out: torch.Tensor, o: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (graphs.bodies.last(agg.global_blocks[depth - 1], frame_out, o),)

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
