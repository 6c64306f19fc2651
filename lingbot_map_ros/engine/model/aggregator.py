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
"""Streaming aggregator: DINO trunk, special tokens and 24 frame/global block pairs.

Dims: S frames in one call, P = 6 + h*w tokens per frame, h x w patch grid, C embed dim,
H heads of D = 64 dims.

Special:
- Input images are in [0, 1]; ImageNet normalisation happens here, with the float32 constants
  (not module buffers: the state dict has none, and a bf16 cast must not round them).
- Each frame gets 6 learned special tokens ahead of its DINO patch tokens:
  [camera, register x 4, scale]. Variants (spec §3): in the scale pass frame 0 uses variant 0 of
  camera/registers and the other frames variant 1; the scale token is variant 0 for every scale
  frame. Every streaming frame uses variant 1 of all three.
- Frame blocks attend within a frame with the 2-D RoPE. Global blocks attend across frames with
  the 3-D video RoPE through the paged KV cache of the stream handed in with the call
  (``cache/stream_kv.py``; FlashInfer semantics, golden README §2.3). The call's cache work is
  planned once for every layer: scale pass = bidirectional attention over all S*P tokens, every
  frame written; keyframe = written (evicting the oldest window frame when the window is full)
  and attended; non-keyframe = written, attended and rolled back at the end of the call. The
  module holds no stream state: two streams can take turns on one aggregator.
- The time index is passed in by the caller (the session owns the counters); it is checked
  against the RoPE table before any cache is touched.
- Taps at ``tap_layers`` are ``concat([after frame block i, after global block i])`` [S, P, 2C].
- Mixed precision (spec §4.6): cast this module's weights to bf16 for the GPU path. LayerNorms
  then run in float32 and the residual stream stays float32 (DINO's stream is bf16), GEMMs and
  attention run in bf16, q/k leave QK-norm + RoPE in float32 and are cast to the KV dtype.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import torch
from torch import nn

from .dino import DinoTrunk
from .layers import Attend, Block, dense_attention, wide_dtype
from .layers.rope import FrameRope, rotate_half_2d, rotate_interleaved, VideoRope
from ..cache.planned import planned
from ..cache.stream_kv import FramePlan, StreamKV
from ..errors import (CachePoolExhaustedError, CacheStateError, InvalidFrameError,
                      ResolutionChangedError, TimeIndexLimitError)
from ..frames import NUM_SPECIAL_TOKENS, Role
from ...config import ModelConfig

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


# ---- the per-layer steps (module functions taking the block: one compiled graph serves every
# block of a kind; the eager loop below and the runner's segments (runner/segments.py) use them)

def with_specials(specials: torch.Tensor, dino: torch.Tensor) -> torch.Tensor:
    """[S, 6, C] special tokens ahead of the [S, h*w, C] DINO tokens: the frame's P tokens."""
    return torch.cat([specials.to(dino.dtype), dino], dim=1)


def frame_step(block: Block, x: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
    """Frame block: attention within each frame [S, P, C], 2-D RoPE tables (cos, sin)."""
    return block(x, rope=lambda t: rotate_half_2d(t, cos, sin))


def global_qkv(block: Block, x: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Global block up to its cache attention: q, k, v of [1, S*P, C], 3-D RoPE applied."""
    return block.qkv(x, rope=lambda t: rotate_interleaved(t, cos, sin))


def global_finish(block: Block, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Global block after its cache attention ``o`` [1, heads, S*P, D]."""
    return block.finish(x, o)


def tap_features(frame_out: torch.Tensor, global_out: torch.Tensor) -> torch.Tensor:
    """Return one layer's tap: [frame-block stream, global-block stream], [S, P, 2C]."""
    return torch.cat([frame_out, global_out], dim=-1)


@dataclass(frozen=True)
class AggregatorOutput:
    """Features of one aggregator call."""

    taps: list[torch.Tensor]
    """One [S, P, 2C] tensor per tap layer: [frame-block stream, global-block stream]."""
    dino_tokens: torch.Tensor
    """[S, h*w, C] final-normed DINO patch tokens."""
    patch_hw: tuple[int, int]
    """(h, w) patch grid."""


class Aggregator(nn.Module):
    """Alternating frame/global attention over DINO tokens with a streaming KV cache."""

    def __init__(self, config: ModelConfig) -> None:
        """Build the modules (parameter names as the official ``aggregator.*``).

        Args:
            config: network shape.
        """
        super().__init__()
        c = config.embed_dim
        self.config = config
        self.patch_embed = DinoTrunk(config.img_size, config.patch_size, c, config.dino_depth,
                                     config.num_heads, config.mlp_ratio, config.num_dino_registers)
        self.camera_token = nn.Parameter(torch.zeros(1, 2, 1, c))
        self.register_token = nn.Parameter(torch.zeros(1, 2, NUM_SPECIAL_TOKENS - 2, c))
        self.scale_token = nn.Parameter(torch.zeros(1, 2, 1, c))
        self.frame_blocks = nn.ModuleList(
            Block(c, config.num_heads, config.mlp_ratio, qk_norm=True, norm_eps=1e-5)
            for _ in range(config.depth))
        self.global_blocks = nn.ModuleList(
            Block(c, config.num_heads, config.mlp_ratio, qk_norm=True, norm_eps=1e-5)
            for _ in range(config.depth))
        self._imagenet_stats: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.frame_rope = FrameRope(config.head_dim, NUM_SPECIAL_TOKENS)
        self.video_rope = VideoRope(config.head_dim, config.max_frame_num,
                                    num_special=NUM_SPECIAL_TOKENS)

    # ---- the stream's KV cache (handed in per call) -------------------------------------------

    def _check_cache(self, kv: StreamKV | None, tokens_per_frame: int,
                     device: torch.device) -> StreamKV:
        if kv is None:
            raise CacheStateError('no KV cache: the call needs a stream (Engine.open_stream; '
                                  'its first frame leases pages of the engine pool)')
        if not _same_device(kv.device, device):
            raise CacheStateError(f'frame on {device} but the KV cache is on {kv.device}; '
                                  'reset the stream first')
        if kv.tokens_per_frame != tokens_per_frame:
            raise ResolutionChangedError(
                f'frame has {tokens_per_frame} tokens but the cache holds frames of '
                f'{kv.tokens_per_frame}; reset the stream to change resolution')
        return kv

    def _check_state(self, kv: StreamKV, num_frames: int, time_index: int,
                     mode: Role) -> None:
        if mode not in ('scale', 'keyframe', 'non-keyframe'):
            raise ValueError(f"mode='{mode}' is not 'scale', 'keyframe' or 'non-keyframe'")
        if mode != 'scale' and num_frames != 1:
            raise ValueError(f'mode={mode} takes one frame, got {num_frames}')
        if time_index < 0:
            raise ValueError(f'time_index={time_index} must be >= 0')
        last = time_index + num_frames - 1
        if last >= self.config.max_frame_num:
            raise TimeIndexLimitError(
                f'time index {last} reaches model.max_frame_num={self.config.max_frame_num}; '
                'reset the stream')
        used = kv.num_frames > 0
        if mode == 'scale' and used:
            raise CacheStateError('scale pass on a cache that already holds frames; reset first')
        if mode != 'scale' and not used:
            raise CacheStateError(f'{mode} frame before the scale pass')
        # A non-keyframe needs a free slot too: its specials stay until it is rolled back.
        remaining = kv.remaining_frames()
        if remaining < num_frames:
            raise CachePoolExhaustedError(
                f'KV cache has room for {remaining} more frames, {num_frames} needed '
                f'(cache.max_total_frames={kv.max_total_frames}); reset')

    def global_attention(self, block_idx: int, kv: StreamKV, plan: FramePlan) -> Attend:
        """Attention of global block ``block_idx`` through the stream's cache, for one call.

        The call's cache work was planned once for every block (``StreamKV.plan_frame``): the
        block writes its K/V where the plan says and attends what the plan says.
        """
        kv_dtype = kv.dtype

        def per_token(t: torch.Tensor) -> torch.Tensor:
            # [1, H, N, D] -> [N, H, D] in the KV dtype. The segment runner hands over views of
            # token-major tensors already (no copy here); otherwise cast and relayout in one copy
            # (a cast keeps the strides; a .contiguous() after it would be a second kernel).
            tokens = t[0].transpose(0, 1)
            if tokens.dtype == kv_dtype and tokens.is_contiguous():
                return tokens
            return tokens.to(kv_dtype, memory_format=torch.contiguous_format)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if plan.role == 'scale':
                out = dense_attention(q.to(kv_dtype), k.to(kv_dtype), v.to(kv_dtype))
                kv.write(plan, block_idx, per_token(k), per_token(v))
                return out
            kv.write(plan, block_idx, per_token(k), per_token(v))
            out = kv.attend(plan, block_idx, per_token(q))
            return out.transpose(0, 1).unsqueeze(0)

        return attend

    # ---- forward --------------------------------------------------------------------------

    def _check_images(self, images: torch.Tensor) -> tuple[int, int]:
        patch = self.config.patch_size
        if images.ndim != 4 or images.shape[1] != 3 or not images.is_floating_point():
            raise InvalidFrameError(f'images must be float [S, 3, H, W], got '
                                    f'{images.dtype} {list(images.shape)}')
        s, _, height, width = images.shape
        if s < 1 or height < patch or width < patch or height % patch or width % patch:
            raise InvalidFrameError(f'image size {height}x{width} (S={s}) must be a positive '
                                    f'multiple of the patch size {patch}')
        return height // patch, width // patch

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """ImageNet-normalise [S, 3, H, W] images in [0, 1], in their wide dtype."""
        # The ImageNet constants are float32 values (as upstream) kept outside the module's
        # buffers, so casting the aggregator to bf16 and back cannot round them.
        wide = wide_dtype(images.dtype)
        key = (images.device, wide)
        if key not in self._imagenet_stats:
            self._imagenet_stats[key] = tuple(
                torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1).to(images.device, wide)
                for v in (_IMAGENET_MEAN, _IMAGENET_STD))
        mean, std = self._imagenet_stats[key]
        return (images.to(wide) - mean) / std

    def special_tokens(self, num_frames: int, mode: Role, dtype: torch.dtype) -> torch.Tensor:
        """Return the [S, 6, C] special tokens of a call (variants as in the module docstring).

        Args:
            num_frames: S.
            mode: 'scale' for the scale pass, otherwise a streaming frame.
            dtype: dtype of the token stream.

        Returns:
            [S, 6, C] tokens [camera, register x 4, scale].
        """
        ones = [1] * num_frames
        first = [0] + ones[1:] if mode == 'scale' else ones
        scale = [0] * num_frames if mode == 'scale' else ones
        tokens = torch.cat([self.camera_token[0, first], self.register_token[0, first],
                            self.scale_token[0, scale]], dim=1)
        return tokens.to(dtype)

    def prepare(self, images: torch.Tensor, time_index: int, mode: Role,
                kv: StreamKV | None) -> tuple[int, int]:
        """Check a call of the streaming schedule against the stream's cache.

        Returns:
            The (h, w) patch grid.

        Raises:
            See :meth:`forward`; nothing is cached when it raises.
        """
        h, w = self._check_images(images)
        kv = self._check_cache(kv, NUM_SPECIAL_TOKENS + h * w, images.device)
        self._check_state(kv, images.shape[0], time_index, mode)
        return h, w

    def forward(self, images: torch.Tensor, time_index: int, mode: Role,
                kv: StreamKV | None) -> AggregatorOutput:
        """Run one call of the streaming schedule eagerly (:meth:`prepare`, then :meth:`run`).

        Args:
            images: [S, 3, H, W] in [0, 1]; S = N_s frames for 'scale', 1 otherwise.
            time_index: 3-D RoPE time of the first frame (scale frames use
                time_index .. time_index+S-1); keyframes cached so far, excluding this one.
            mode: 'scale' (phase 1), 'keyframe' or 'non-keyframe'.
            kv: the stream's KV cache (``StreamKV``).

        Returns:
            The taps and DINO tokens of the S frames.

        Raises:
            InvalidFrameError: bad image shape or dtype.
            ValueError: bad mode, frame count or time index.
            TimeIndexLimitError: a time index at or past ``max_frame_num``.
            CachePoolExhaustedError: no room for another keyframe.
            CacheStateError: no cache, a scale pass on a used cache, a frame before
                the scale pass, or a frame on another device than the cache.
            ResolutionChangedError: the frame size differs from the cached frames'.
        """
        return self.run(images, time_index, mode, self.prepare(images, time_index, mode, kv), kv)

    def run(self, images: torch.Tensor, time_index: int, mode: Role,
            patch_hw: tuple[int, int], kv: StreamKV) -> AggregatorOutput:
        """Run the layer loop of a call that :meth:`prepare` accepted (arguments as there).

        The call's cache work is planned once, before the first layer, and ended after the
        last (``StreamKV.plan_frame`` / ``end_frame``).
        """
        with planned([kv.planning(mode, images.shape[0])]) as (plan,):
            return self._layers(images, time_index, mode, patch_hw, kv, plan)

    def _layers(self, images: torch.Tensor, time_index: int, mode: Role,
                patch_hw: tuple[int, int], kv: StreamKV, plan: FramePlan) -> AggregatorOutput:
        dino = self.patch_embed(self.normalize(images))
        steps = self.block_steps(dino, time_index, mode, patch_hw, kv, plan)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def block_steps(self, dino: torch.Tensor, time_index: int, mode: Role,
                    patch_hw: tuple[int, int], kv: StreamKV, plan: FramePlan,
                    camera_only: bool = False) -> Generator[None, None, AggregatorOutput]:
        """Run the block pairs of a call on its DINO tokens, pausing after each pair.

        A resumable layer loop: the caller can run other work between two block pairs (a
        rollover's next session spreads its scale pass over frames: engine/scale_pass.py).
        ``kv`` needs ``dtype`` and ``write`` only for a scale pass. Returns the call's output;
        with ``camera_only`` its one tap is the last tap layer's camera token [S, 1, 2C], all
        the camera head reads: a pass without depth then holds no [S, P, 2C] float32 taps
        between its pauses (0.24 GiB for 8 frames at 504x378).
        """
        h, w = patch_hw
        s, p = dino.shape[0], NUM_SPECIAL_TOKENS + h * w
        x = with_specials(self.special_tokens(s, mode, dino.dtype), dino)
        rope_dtype = wide_dtype(self.camera_token.dtype)
        frame_cos, frame_sin = self.frame_rope.tables(h, w, dino.device, rope_dtype)
        video_cos, video_sin = self.video_rope.tables(time_index, s, h, w, dino.device,
                                                      rope_dtype)
        taps, last_tap = [], max(self.config.tap_layers)
        for i, (frame_block, global_block) in enumerate(zip(self.frame_blocks,
                                                            self.global_blocks)):
            frame_out = frame_step(frame_block, x, frame_cos, frame_sin)
            x = frame_out.reshape(1, s * p, -1)
            q, k, v = global_qkv(global_block, x, video_cos, video_sin)
            o = self.global_attention(i, kv, plan)(q, k, v)
            x = global_finish(global_block, x, o).reshape(s, p, -1)
            if camera_only and i == last_tap:
                taps.append(tap_features(frame_out[:, :1], x[:, :1]))
            elif not camera_only and i in self.config.tap_layers:
                taps.append(tap_features(frame_out, x))
            # Nothing of the pair but its output outlives it: a pause holds no q/k/v.
            del frame_out, q, k, v, o
            yield
        return AggregatorOutput(taps=taps, dino_tokens=dino, patch_hw=(h, w))


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Compare devices, 'cuda' meaning the current CUDA device."""
    def index(d: torch.device) -> int | None:
        return torch.cuda.current_device() if d.type == 'cuda' and d.index is None else d.index
    return a.type == b.type and index(a) == index(b)
