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
"""LingbotMapModel: the streaming GCT network = aggregator + camera head (+ DPT depth head).

Dims: S frames in one call, H x W image (multiples of 14), P tokens per frame, C embed dim,
I camera-head iterations.

Special:
- State-dict names are exactly the official ones (``aggregator.*``, ``camera_head.*``,
  ``depth_head.*``; 1342 tensors for the official config, no ``point_head``).
- The model is stateful: the paged KV cache it is handed and the camera head's K/V cache persist
  between calls. The caller owns the KV cache (``engine.cache.new_stream_cache``; the session
  builds it) and drives the schedule: :meth:`start_stream` with the cache, one
  :meth:`forward_scale` with the N_s scale frames, then :meth:`forward_frame` per frame with the
  time index it owns (keyframes cached so far, scale frames included). To restart, the caller
  resets its KV cache and calls :meth:`reset_stream`.
- Precision: weights are float32 as loaded. :meth:`cast_aggregator` puts the aggregator (DINO
  included) in bf16 for the GPU path; the heads always run in their own dtype (float32), on
  float32 features. ``model.double()`` plus a float64 KV dtype gives a float64 reference run.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention import sdpa_kernel, SDPBackend

from .aggregator import Aggregator
from .frame_runner import FrameRunner
from .heads.camera_head import CameraHead
from .heads.dpt_head import DPTHead
from ..cache import FlashInferKVCacheManager
from ..frames import Role
from ..stats import CacheStats
from ...config import FastPath, ModelConfig

# NOTE: cuDNN's SDPA builds an execution plan per new sequence length, and the global blocks'
# key count changes every frame: on the H200 that cost ~0.8 ms of host time per call
# (bench/results/h200_baseline/profile_sdpa.txt). Flash (bf16/fp16) and memory-efficient (fp32)
# kernels take any length at no planning cost; the math kernel covers the CPU. (The cache's
# ``sdpa`` backend still calls cuDNN on purpose where the length is fixed: attention/split.py.)
_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class LingbotMapModel(nn.Module):
    """Streaming LingBot-Map model with official parameter names."""

    def __init__(self, config: ModelConfig | None = None) -> None:
        """Build the modules (weights uninitialised; load them with ``weights.load_weights``).

        Args:
            config: network shape; default the official model.
        """
        super().__init__()
        self.config = config or ModelConfig()
        self.aggregator = Aggregator(self.config)
        self.camera_head = CameraHead.from_config(self.config)
        self.depth_head = DPTHead.from_config(self.config) if self.config.enable_depth else None
        self.frame_runner = FrameRunner(self.aggregator, self.camera_head, self.depth_head)
        """Runs a call's aggregator and heads: eager, segments or whole frames
        (``frame_runner.py``)."""

    @classmethod
    def empty(cls, config: ModelConfig | None = None, device: str | torch.device = 'cpu',
              dtype: torch.dtype = torch.float32) -> 'LingbotMapModel':
        """Allocate the model without initialising it (every tensor is loaded right after).

        Skips torch's random init of 1.16 B parameters, which only gets overwritten.

        Raises:
            RuntimeError: the model has buffers, which ``to_empty`` would leave unset.
        """
        with torch.device('meta'):
            model = cls(config)
        if any(True for _ in model.buffers()):
            raise RuntimeError('LingbotMapModel.empty: the model has buffers; fill them '
                               'explicitly')
        return model.to(dtype).to_empty(device=device).eval()

    @property
    def compute_dtype(self) -> torch.dtype:
        """Dtype of the aggregator weights (its GEMM dtype)."""
        return self.aggregator.camera_token.dtype

    def cast_aggregator(self, dtype: torch.dtype) -> 'LingbotMapModel':
        """Convert the aggregator weights (DINO included) to ``dtype``; heads are unchanged.

        bf16 gives the GPU path of spec §4.6: bf16 GEMMs and attention, float32 LayerNorms and
        residual stream, float32 q/k after QK-norm and RoPE.

        Args:
            dtype: torch.bfloat16, torch.float16, torch.float32 or torch.float64.

        Returns:
            self.

        Raises:
            ValueError: not a floating dtype.
        """
        if not dtype.is_floating_point:
            raise ValueError(f'cast_aggregator: dtype={dtype} is not a floating dtype')
        self.aggregator.to(dtype)
        return self

    def set_fast_path(self, mode: FastPath, compile: bool = False) -> None:  # noqa: A002
        """Choose how streaming frames run (outputs equal the plain path's to rounding).

        Args:
            mode: 'eager', 'segments' or 'whole_frame' (an upper bound, see
                ``frame_runner.py``); on CUDA the fast path's steps are replayed as CUDA graphs,
                on the CPU they run directly.
            compile: ``torch.compile`` the fast path's fixed-shape work (Inductor fusion).
        """
        self.frame_runner.set_fast_path(mode, compile)

    # ---- stream state ---------------------------------------------------------------------

    def start_stream(self, kv_cache: FlashInferKVCacheManager) -> None:
        """Start a stream on ``kv_cache`` (empty; its owner resets it) with an empty camera cache.

        Args:
            kv_cache: the global-attention cache for this stream's frame size
                (``engine.cache.new_stream_cache``).
        """
        self.aggregator.attach_cache(kv_cache)
        self.camera_head.reset_cache()

    def stop_stream(self) -> None:
        """Let go of the KV cache (its owner is about to free it for a new frame size)."""
        self.aggregator.attach_cache(None)

    def reset_stream(self) -> None:
        """Empty the camera-head cache, keeping its memory (the KV cache's owner resets that)."""
        self.camera_head.reset_cache(keep_memory=True)

    def cache_stats(self) -> CacheStats | None:
        """Occupancy of the global KV cache and of the camera-head cache.

        Returns:
            None before a KV cache is handed in (``start_stream``).
        """
        stats = self.aggregator.cache_stats()
        if stats is None:
            return None
        camera = self.camera_head.cache_stats()
        return CacheStats.from_manager(stats, camera.num_frames, camera.allocated_bytes)

    # ---- forward --------------------------------------------------------------------------

    @torch.no_grad()
    def forward_scale(self, images: torch.Tensor, with_depth: bool = False,
                      return_taps: bool = False) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """Phase 1: run the N_s scale frames together (time indices 0 .. N_s-1) and cache them.

        Args:
            images: [S, 3, H, W] in [0, 1], S = N_s frames of a freshly reset stream.
            with_depth: also run the depth head.
            return_taps: also return 'taps' (list of [S, P, 2C]) and 'dino_tokens' [S, h*w, C].

        Returns:
            See :meth:`forward`.
        """
        return self(images, 0, 'scale', with_depth, return_taps)

    @torch.no_grad()
    def forward_frame(self, image: torch.Tensor, time_index: int, keyframe: bool,
                      with_depth: bool = False,
                      return_taps: bool = False) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """Phase 2: one streaming frame; a keyframe is cached, a non-keyframe is not.

        Args:
            image: [1, 3, H, W] in [0, 1].
            time_index: keyframes cached so far (scale frames included); a non-keyframe uses
                the index the next keyframe will get.
            keyframe: cache the frame (global KV window + camera-head cache).
            with_depth: also run the depth head.
            return_taps: also return 'taps' and 'dino_tokens'.

        Returns:
            See :meth:`forward`.
        """
        mode: Role = 'keyframe' if keyframe else 'non-keyframe'
        return self(image, time_index, mode, with_depth, return_taps)

    def forward(self, images: torch.Tensor, time_index: int, mode: Role, with_depth: bool = False,
                return_taps: bool = False) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """Run aggregator and heads for one call of the schedule.

        Args:
            images: [S, 3, H, W] in [0, 1].
            time_index: RoPE time of the first frame.
            mode: 'scale', 'keyframe' or 'non-keyframe'.
            with_depth: also run the depth head.
            return_taps: also return the aggregator features.

        Returns:
            'pose_enc' [S, 9] and 'pose_enc_iters' [S, I, 9] (float32, ``[t, q_xyzw, fov_h,
            fov_w]``); with depth 'depth' and 'depth_conf' [S, H, W]; with taps 'taps'
            (list of [S, P, 2C]) and 'dino_tokens' [S, h*w, C].

        Raises:
            ValueError: depth requested but the depth head is not built; see also
                :meth:`Aggregator.forward` and :meth:`CameraHead.forward`.
        """
        if with_depth and self.depth_head is None:
            raise ValueError('with_depth=True but the model was built with enable_depth=False')
        runner = self.frame_runner
        with sdpa_kernel(_SDPA_BACKENDS):
            features = runner(images, time_index, mode)
            pose_enc, pose_enc_iters = runner.camera(features.taps[-1][:, 0], mode)
        out: dict[str, torch.Tensor | list[torch.Tensor]] = {
            'pose_enc': pose_enc, 'pose_enc_iters': pose_enc_iters}
        if with_depth:
            out['depth'], out['depth_conf'] = runner.depth(features.taps, images.shape[-2:])
        if return_taps:
            out['taps'] = features.taps
            out['dino_tokens'] = features.dino_tokens
        return out
