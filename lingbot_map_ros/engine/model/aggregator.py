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
  the 3-D video RoPE through the paged KV cache (FlashInfer semantics, golden README §2.3):
  scale pass = bidirectional attention over all S*P tokens, then each frame is appended;
  keyframe = append, evict, attend; non-keyframe = append, attend, roll back.
- The time index is passed in by the caller (the session owns the counters); it is checked
  against the RoPE table before any cache is touched.
- Taps at ``tap_layers`` are ``concat([after frame block i, after global block i])`` [S, P, 2C].
- Mixed precision (spec §4.6): cast this module's weights to bf16 for the GPU path. LayerNorms
  then run in float32 and the residual stream stays float32 (DINO's stream is bf16), GEMMs and
  attention run in bf16, q/k leave QK-norm + RoPE in float32 and are cast to the KV dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
import logging

import torch
from torch import nn

from .dino import DinoTrunk
from .layers import Attend, Block, dense_attention, wide_dtype
from .layers.rope import FrameRope, rotate_half_2d, rotate_interleaved, VideoRope
from ..cache import FlashInferKVCacheManager
from ..errors import (CachePoolExhaustedError, CacheStateError, InvalidFrameError,
                      ResolutionChangedError, TimeIndexLimitError)
from ..frames import NUM_SPECIAL_TOKENS, Role
from ...config import CacheConfig, ModelConfig

logger = logging.getLogger(__name__)

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


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
        self._cache_config = CacheConfig()
        self._kv_dtype = torch.float32
        self._cache: FlashInferKVCacheManager | None = None
        self._cache_used = False

    # ---- KV cache -------------------------------------------------------------------------

    def configure_cache(self, cache: CacheConfig, kv_dtype: torch.dtype) -> None:
        """Set the cache's windows, backend and storage dtype; drops any cached frames.

        Args:
            cache: N_s, W, capacity and backend.
            kv_dtype: storage dtype of K/V (bf16 on the GPU path, float32/float64 on CPU).
        """
        self._cache_config = cache
        self._kv_dtype = kv_dtype
        self._cache = None
        self._cache_used = False

    def reset_cache(self) -> None:
        """Forget every cached frame (the manager and its memory are kept)."""
        if self._cache is not None:
            self._cache.reset()
        self._cache_used = False

    @property
    def kv_dtype(self) -> torch.dtype:
        """Storage dtype of the cached K/V."""
        return self._kv_dtype

    @property
    def kv_cache(self) -> FlashInferKVCacheManager | None:
        """Return the paged cache manager, or None before the first frame of a configuration."""
        return self._cache

    def cache_stats(self) -> dict | None:
        """Return the cache occupancy counters; None before the first frame."""
        return None if self._cache is None else self._cache.get_cache_stats()

    @property
    def cache_config(self) -> CacheConfig:
        """Return the configuration the next cache manager is built from."""
        return self._cache_config

    def remaining_frames(self) -> int:
        """Keyframes the cache can still take (``max_total_frames`` before the first frame)."""
        if self._cache is None:
            return self._cache_config.max_total_frames
        return int(self._cache.remaining_frames())

    def _ensure_cache(self, tokens_per_frame: int, device: torch.device) -> None:
        cache = self._cache
        if cache is not None and cache.tokens_per_frame == tokens_per_frame \
                and cache.device == device:
            return
        if cache is not None and self._cache_used:
            if cache.device != device:
                raise CacheStateError(f'frame on {device} but the cache holds frames on '
                                      f'{cache.device}; reset the stream first')
            raise ResolutionChangedError(
                f'frame has {tokens_per_frame} tokens but the cache holds frames of '
                f'{cache.tokens_per_frame}; reset the stream to change resolution')
        cfg = self._cache_config
        self._cache = FlashInferKVCacheManager(
            num_blocks=self.config.depth, max_num_frames=self.config.max_frame_num,
            tokens_per_frame=tokens_per_frame, num_heads=self.config.num_heads,
            head_dim=self.config.head_dim, dtype=self._kv_dtype, device=device,
            num_special_tokens=NUM_SPECIAL_TOKENS, scale_frames=cfg.scale_frames,
            sliding_window=cfg.sliding_window, max_total_frames=cfg.max_total_frames,
            backend=cfg.backend)
        logger.info('KV cache: %d tokens/frame, N_s=%d, W=%d, %s, backend %s', tokens_per_frame,
                    cfg.scale_frames, cfg.sliding_window, self._kv_dtype, cfg.backend)

    def _check_state(self, num_frames: int, time_index: int, mode: Role) -> None:
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
        if mode == 'scale' and self._cache_used:
            raise CacheStateError('scale pass on a cache that already holds frames; reset first')
        if mode != 'scale' and not self._cache_used:
            raise CacheStateError(f'{mode} frame before the scale pass')
        # A non-keyframe needs a free slot too: its specials stay until it is rolled back.
        remaining = self.remaining_frames()
        if remaining < num_frames:
            raise CachePoolExhaustedError(
                f'KV cache has room for {remaining} more frames, {num_frames} needed '
                f'(cache.max_total_frames={self._cache_config.max_total_frames}); reset')

    def global_attention(self, block_idx: int, mode: Role, num_frames: int,
                         tokens_per_frame: int) -> Attend:
        """Attention of global block ``block_idx`` through the paged cache, for one call."""
        cache, kv_dtype = self._cache, self._kv_dtype
        cfg = self._cache_config

        def per_token(t: torch.Tensor) -> torch.Tensor:
            # [1, H, N, D] -> [N, H, D] in the KV dtype. The segment runner hands over views of
            # token-major tensors already (no copy here); otherwise cast and relayout in one copy
            # (a cast keeps the strides; a .contiguous() after it would be a second kernel).
            tokens = t[0].transpose(0, 1)
            if tokens.dtype == kv_dtype and tokens.is_contiguous():
                return tokens
            return tokens.to(kv_dtype, memory_format=torch.contiguous_format)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if mode == 'scale':
                out = dense_attention(q.to(kv_dtype), k.to(kv_dtype), v.to(kv_dtype))
                keys, values = per_token(k), per_token(v)
                for f in range(num_frames):
                    rows = slice(f * tokens_per_frame, (f + 1) * tokens_per_frame)
                    cache.append_frame(block_idx, keys[rows], values[rows], keyframe=True)
                return out
            keyframe = mode == 'keyframe'
            cache.append_frame(block_idx, per_token(k), per_token(v), keyframe=keyframe)
            if keyframe:
                cache.evict_frames(block_idx, cfg.scale_frames, cfg.sliding_window)
            out = cache.compute_attention(block_idx, per_token(q))
            if not keyframe:
                cache.rollback_last_frame(block_idx)
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

    def prepare(self, images: torch.Tensor, time_index: int, mode: Role) -> tuple[int, int]:
        """Check a call of the streaming schedule and build the cache it needs.

        Returns:
            The (h, w) patch grid.

        Raises:
            See :meth:`forward`; nothing is cached when it raises.
        """
        h, w = self._check_images(images)
        self._check_state(images.shape[0], time_index, mode)
        self._ensure_cache(NUM_SPECIAL_TOKENS + h * w, images.device)
        return h, w

    def mark_cache_used(self) -> None:
        """Record that frames are going into the cache (a runner other than :meth:`run`)."""
        self._cache_used = True

    def forward(self, images: torch.Tensor, time_index: int, mode: Role) -> AggregatorOutput:
        """Run one call of the streaming schedule eagerly (:meth:`prepare`, then :meth:`run`).

        Args:
            images: [S, 3, H, W] in [0, 1]; S = N_s frames for 'scale', 1 otherwise.
            time_index: 3-D RoPE time of the first frame (scale frames use
                time_index .. time_index+S-1); keyframes cached so far, excluding this one.
            mode: 'scale' (phase 1), 'keyframe' or 'non-keyframe'.

        Returns:
            The taps and DINO tokens of the S frames.

        Raises:
            InvalidFrameError: bad image shape or dtype.
            ValueError: bad mode, frame count or time index.
            TimeIndexLimitError: a time index at or past ``max_frame_num``.
            CachePoolExhaustedError: no room for another keyframe.
            CacheStateError: scale pass on a used cache, a frame before the scale pass, or a
                frame on another device than the cached ones.
            ResolutionChangedError: the frame size differs from the cached frames'.
        """
        return self.run(images, time_index, mode, self.prepare(images, time_index, mode))

    def run(self, images: torch.Tensor, time_index: int, mode: Role,
            patch_hw: tuple[int, int]) -> AggregatorOutput:
        """Run the layer loop of a call that :meth:`prepare` accepted (arguments as there)."""
        h, w = patch_hw
        s, p = images.shape[0], NUM_SPECIAL_TOKENS + h * w
        dino = self.patch_embed(self.normalize(images))
        x = torch.cat([self.special_tokens(s, mode, dino.dtype), dino], dim=1)
        rope_dtype = wide_dtype(self.camera_token.dtype)
        frame_cos, frame_sin = self.frame_rope.tables(h, w, images.device, rope_dtype)
        video_cos, video_sin = self.video_rope.tables(time_index, s, h, w, images.device,
                                                      rope_dtype)
        self._cache_used = True
        taps = []
        for i, (frame_block, global_block) in enumerate(zip(self.frame_blocks,
                                                            self.global_blocks)):
            x = frame_block(x, rope=lambda t: rotate_half_2d(t, frame_cos, frame_sin))
            frame_out = x
            x = global_block(x.reshape(1, s * p, -1),
                             rope=lambda t: rotate_interleaved(t, video_cos, video_sin),
                             attend=self.global_attention(i, mode, s, p)).reshape(s, p, -1)
            if i in self.config.tap_layers:
                taps.append(torch.cat([frame_out, x], dim=-1))
        return AggregatorOutput(taps=taps, dino_tokens=dino, patch_hw=(h, w))
