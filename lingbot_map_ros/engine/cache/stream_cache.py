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
"""new_kv_pool: the engine's KV page pool for one image size.

The engine (``engine/engine.py``) builds it at the first frame of a size, sized for
``cache.streams`` streams (or ``cache.pool_pages``), and its streams lease pages of it
(``stream_kv.py``). The model only reads and writes the pages a stream hands it.
"""

from __future__ import annotations

import logging

import torch

from .capacity import pool_pages
from .kv_pool import KVPool
from ..frames import NUM_SPECIAL_TOKENS
from ...config import CacheConfig, ModelConfig

logger = logging.getLogger(__name__)


def tokens_per_frame(model: ModelConfig, image_hw: tuple[int, int]) -> int:
    """Tokens of one frame of processed size ``image_hw``: 6 specials + the patch grid."""
    patch = model.patch_size
    return NUM_SPECIAL_TOKENS + (image_hw[0] // patch) * (image_hw[1] // patch)


def new_kv_pool(model: ModelConfig, cache: CacheConfig, kv_dtype: torch.dtype,
                image_hw: tuple[int, int], device: torch.device | str,
                check_frames: int = 0) -> KVPool:
    """Build the global-attention KV page pool for frames of processed size ``image_hw``.

    Args:
        model: network shape (depth, heads).
        cache: N_s, W, capacity, streams / pool pages and attention backend.
        kv_dtype: K/V attention dtype (bf16 on the GPU path; float32 or float64 on CPU); the
            storage is FP8 instead when ``cache.dtype`` is 'float8_e4m3fn'.
        image_hw: processed (H, W), multiples of the patch size.
        device: where the K/V pages live.
        check_frames: frames of one extra scale pass the pool has room for (``capacity``).

    Raises:
        ImportError: the FlashInfer backend was asked for and is not installed.
    """
    page_size = tokens_per_frame(model, image_hw) - NUM_SPECIAL_TOKENS
    pool = KVPool(num_layers=model.depth, num_pages=pool_pages(cache, page_size,
                                                               check_frames=check_frames),
                  page_size=page_size, num_heads=model.num_heads, head_dim=model.head_dim,
                  num_special_tokens=NUM_SPECIAL_TOKENS, dtype=kv_dtype,
                  device=torch.device(device), backend=cache.backend,
                  # FP8 is a storage format only: attention runs in ``kv_dtype``.
                  storage_dtype=torch.float8_e4m3fn if cache.dtype == 'float8_e4m3fn' else None,
                  full_patch_pages=cache.scale_frames + cache.sliding_window,
                  precision=cache.precision, kernel=cache.kernel)
    logger.info('KV page pool: %d pages of %d tokens (+%d specials per frame), N_s=%d, W=%d, '
                '%s, backend %s (%s)', pool.num_pages, page_size, NUM_SPECIAL_TOKENS,
                cache.scale_frames, cache.sliding_window, pool.storage_dtype, pool.backend_name,
                pool.precision)
    if cache.kernel.changed():
        logger.info('cache.kernel off its defaults: %s', cache.kernel.changed())
    return pool
