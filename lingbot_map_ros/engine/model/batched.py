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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .aggregator import (Aggregator, AggregatorOutput, frame_step, global_finish, global_qkv,
                         tap_features, with_specials)
from .layers import wide_dtype
from ..cache.stream_kv import FramePlan, StreamKV
from ..frames import Role


@dataclass(frozen=True)
class BatchCall:
    """One stream's frame in a batch."""

    kv: StreamKV
    """The stream's KV cache (its pages of the engine pool)."""
    time_index: int
    """3-D RoPE time of the frame (keyframes the stream cached so far)."""
    mode: Role
    """'keyframe' or 'non-keyframe' (a scale pass never batches)."""


def run_batched(agg: Aggregator, images: torch.Tensor, calls: Sequence[BatchCall],
                patch_hw: tuple[int, int]) -> AggregatorOutput:
    """Run the frames ``images`` [B, 3, H, W] of ``calls`` (one per stream) through ``agg``.

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
        out = _layers(agg, images, calls, plans, patch_hw)
    except BaseException:
        for call, plan in zip(calls, plans):
            call.kv.end_frame(plan, failed=True)
        raise
    for call, plan in zip(calls, plans):
        call.kv.end_frame(plan)
    return out


def _layers(agg: Aggregator, images: torch.Tensor, calls: Sequence[BatchCall],
            plans: Sequence[FramePlan], patch_hw: tuple[int, int]) -> AggregatorOutput:
    h, w = patch_hw
    b = images.shape[0]
    dino = agg.patch_embed(agg.normalize(images))
    # Streaming frames all take variant 1 of every special token, keyframe or not.
    x = with_specials(agg.special_tokens(b, 'keyframe', dino.dtype), dino)
    rope_dtype = wide_dtype(agg.camera_token.dtype)
    frame_cos, frame_sin = agg.frame_rope.tables(h, w, images.device, rope_dtype)
    # Each frame's own time index: [B, 1, P, D/2] tables broadcast over the heads.
    tables = [agg.video_rope.tables(call.time_index, 1, h, w, images.device, rope_dtype)
              for call in calls]
    video_cos = torch.stack([cos for cos, _ in tables])[:, None]
    video_sin = torch.stack([sin for _, sin in tables])[:, None]
    taps = []
    for i, (frame_block, global_block) in enumerate(zip(agg.frame_blocks, agg.global_blocks)):
        frame_out = frame_step(frame_block, x, frame_cos, frame_sin)
        q, k, v = global_qkv(global_block, frame_out, video_cos, video_sin)
        o = torch.cat([agg.global_attention(i, call.kv, plan)(q[j:j + 1], k[j:j + 1],
                                                              v[j:j + 1])
                       for j, (call, plan) in enumerate(zip(calls, plans))])
        x = global_finish(global_block, frame_out, o)
        if i in agg.config.tap_layers:
            taps.append(tap_features(frame_out, x))
    return AggregatorOutput(taps=taps, dino_tokens=dino, patch_hw=(h, w))
