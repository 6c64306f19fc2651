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
- The model holds no stream state: every call brings its stream (:class:`StreamState`: the
  stream's KV cache on the engine's page pool and its camera-head cache), so several streams
  take turns on one model (weights loaded once). The caller drives the schedule: one
  :meth:`forward_scale` with the N_s scale frames, then :meth:`forward_frame` per frame with the
  time index it owns (keyframes cached so far, scale frames included); it resets or releases
  the stream's caches itself (``engine/engine.py`` does all of this for a session).
- The model runs eagerly and imports no runner: the fast path (batches, CUDA graphs,
  ``torch.compile``) is ``engine/runner``'s, built on the steps the model exposes (the
  aggregator's per-layer steps, the heads' ``frame_step``).
- Precision: weights are float32 as loaded. :meth:`cast_aggregator` puts the aggregator (DINO
  included) in bf16 for the GPU path; the heads always run in their own dtype (float32), on
  float32 features. ``model.double()`` plus a float64 KV dtype gives a float64 reference run.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib

import torch
from torch import nn
from torch.nn.attention import sdpa_kernel, SDPBackend

from .aggregator import Aggregator
from .heads.camera_head import CameraHead, CameraKVCache
from .heads.dpt_head import DPTHead
from .place_descriptor import place_descriptor
from .stream_state import StreamState
from ..frames import Role
from ...config import ModelConfig

# NOTE: cuDNN's SDPA builds an execution plan per new sequence length, and the global blocks'
# key count changes every frame: every call would pay a plan's host time (docs/performance.md,
# 'cuDNN plans'). Flash (bf16/fp16) and memory-efficient (fp32) kernels take any length at no
# planning cost; the math kernel covers the CPU. (The cache's ``sdpa`` backend still calls
# cuDNN on purpose where the length is fixed: attention/split.py.)
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

    # ---- stream state ---------------------------------------------------------------------

    def new_camera_cache(self) -> CameraKVCache:
        """Return an empty camera-head K/V cache for a new stream (no memory until its frame)."""
        config = self.config
        return CameraKVCache(config.camera_num_iterations, config.camera_trunk_depth,
                             config.camera_num_heads,
                             2 * config.embed_dim // config.camera_num_heads)

    @contextlib.contextmanager
    def _bound(self, stream: StreamState) -> Iterator[None]:
        """Point the camera head at ``stream``'s cache for one call.

        The head reads ``head.cache``; its own, always empty, cache is back afterwards.
        """
        own = self.camera_head.cache
        self.camera_head.cache = stream.camera
        try:
            yield
        finally:
            self.camera_head.cache = own

    @contextlib.contextmanager
    def call_context(self, stream: StreamState) -> Iterator[None]:
        """Enter what one call on ``stream`` runs in (SDPA kernels, the stream's camera cache).

        For callers that run a call's parts themselves (engine/scale_pass.py).
        """
        with sdpa_kernel(_SDPA_BACKENDS), self._bound(stream):
            yield

    # ---- forward --------------------------------------------------------------------------

    @torch.no_grad()
    def forward_scale(self, images: torch.Tensor, stream: StreamState, with_depth: bool = False,
                      return_taps: bool = False, with_descriptor: bool = False,
                      ) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """Phase 1: run the N_s scale frames together (time indices 0 .. N_s-1) and cache them.

        Args:
            images: [S, 3, H, W] in [0, 1], S = N_s frames of a freshly reset stream.
            stream: the stream's caches.
            with_depth: also run the depth head.
            return_taps: also return 'taps' (list of [S, P, 2C]) and 'dino_tokens' [S, h*w, C].
            with_descriptor: also return each frame's place descriptor.

        Returns:
            See :meth:`forward`.
        """
        return self(images, 0, 'scale', stream, with_depth, return_taps, with_descriptor)

    @torch.no_grad()
    def forward_frame(self, image: torch.Tensor, time_index: int, keyframe: bool,
                      stream: StreamState, with_depth: bool = False, return_taps: bool = False,
                      with_descriptor: bool = False,
                      ) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """Phase 2: one streaming frame; a keyframe is cached, a non-keyframe is not.

        Args:
            image: [1, 3, H, W] in [0, 1].
            time_index: keyframes cached so far (scale frames included); a non-keyframe uses
                the index the next keyframe will get.
            keyframe: cache the frame (global KV window + camera-head cache).
            stream: the stream's caches.
            with_depth: also run the depth head.
            return_taps: also return 'taps' and 'dino_tokens'.
            with_descriptor: also return the frame's place descriptor.

        Returns:
            See :meth:`forward`.
        """
        mode: Role = 'keyframe' if keyframe else 'non-keyframe'
        return self(image, time_index, mode, stream, with_depth, return_taps, with_descriptor)

    def forward(self, images: torch.Tensor, time_index: int, mode: Role, stream: StreamState,
                with_depth: bool = False, return_taps: bool = False,
                with_descriptor: bool = False) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """Run aggregator and heads for one call of the schedule on ``stream``, eagerly.

        Args:
            images: [S, 3, H, W] in [0, 1].
            time_index: RoPE time of the first frame.
            mode: 'scale', 'keyframe' or 'non-keyframe'.
            stream: the stream's caches (KV cache and camera-head cache), read and written.
            with_depth: also run the depth head.
            return_taps: also return the aggregator features.
            with_descriptor: also return the place descriptors (``place_descriptor.py``),
                pooled from the DINO tokens the call returns (the runner pools them the same
                way after its graphs).

        Returns:
            'pose_enc' [S, 9] and 'pose_enc_iters' [S, I, 9] (float32, ``[t, q_xyzw, fov_h,
            fov_w]``); with depth 'depth' and 'depth_conf' [S, H, W]; with taps 'taps'
            (list of [S, P, 2C]) and 'dino_tokens' [S, h*w, C]; with descriptors
            'descriptor' [S, C] float32, unit norm.

        Raises:
            ValueError: depth requested but the depth head is not built; see also
                :meth:`Aggregator.forward` and :meth:`CameraHead.forward`.
        """
        if with_depth and self.depth_head is None:
            raise ValueError('with_depth=True but the model was built with enable_depth=False')
        with sdpa_kernel(_SDPA_BACKENDS), self._bound(stream):
            features = self.aggregator(images, time_index, mode, stream.kv)
            pose_enc, pose_enc_iters = self.camera_head(features.taps[-1][:, 0], mode)
        out: dict[str, torch.Tensor | list[torch.Tensor]] = {
            'pose_enc': pose_enc, 'pose_enc_iters': pose_enc_iters}
        if with_depth:
            out['depth'], out['depth_conf'] = self.depth_head(features.taps, images.shape[-2:])
        if return_taps:
            out['taps'] = features.taps
            out['dino_tokens'] = features.dino_tokens
        if with_descriptor:
            out['descriptor'] = place_descriptor(features.dino_tokens)
        return out
