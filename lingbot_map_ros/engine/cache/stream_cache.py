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
"""new_stream_cache: the KV cache a streaming session owns, sized for one image size.

The session (``engine/pipeline.py``) builds it at the first frame of a size and hands it to the
model, which only reads and writes it; resets go through the session.
"""

from __future__ import annotations

import logging

import torch

from .manager import FlashInferKVCacheManager
from ..frames import NUM_SPECIAL_TOKENS
from ...config import CacheConfig, ModelConfig

logger = logging.getLogger(__name__)


def tokens_per_frame(model: ModelConfig, image_hw: tuple[int, int]) -> int:
    """Tokens of one frame of processed size ``image_hw``: 6 specials + the patch grid."""
    patch = model.patch_size
    return NUM_SPECIAL_TOKENS + (image_hw[0] // patch) * (image_hw[1] // patch)


def new_stream_cache(model: ModelConfig, cache: CacheConfig, kv_dtype: torch.dtype,
                     image_hw: tuple[int, int],
                     device: torch.device | str) -> FlashInferKVCacheManager:
    """Build the global-attention KV cache for frames of processed size ``image_hw``.

    Args:
        model: network shape (depth, heads, RoPE table length).
        cache: N_s, W, capacity and attention backend.
        kv_dtype: K/V attention dtype (bf16 on the GPU path; float32 or float64 on CPU); the
            storage is FP8 instead when ``cache.dtype`` is 'float8_e4m3fn'.
        image_hw: processed (H, W), multiples of the patch size.
        device: where the K/V pages live.

    Raises:
        ImportError: the FlashInfer backend was asked for and is not installed.
    """
    tokens = tokens_per_frame(model, image_hw)
    manager = FlashInferKVCacheManager(
        num_blocks=model.depth, max_num_frames=model.max_frame_num, tokens_per_frame=tokens,
        num_heads=model.num_heads, head_dim=model.head_dim, dtype=kv_dtype, device=device,
        num_special_tokens=NUM_SPECIAL_TOKENS, scale_frames=cache.scale_frames,
        sliding_window=cache.sliding_window, max_total_frames=cache.max_total_frames,
        backend=cache.backend,
        # FP8 is a storage format only: attention runs in ``kv_dtype`` (docs/gpu_memory.md).
        storage_dtype=torch.float8_e4m3fn if cache.dtype == 'float8_e4m3fn' else None)
    logger.info('KV cache: %d tokens/frame, N_s=%d, W=%d, %s, backend %s', tokens,
                cache.scale_frames, cache.sliding_window, manager.storage_dtype, cache.backend)
    return manager
