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
"""How many bytes a cache configuration allocates, before any GPU memory is touched.

The engine's KV page pool is allocated whole when the first frame arrives: ``L`` layers x pool
pages x ``T`` tokens x ``H`` heads x ``D`` dims x 2 (K and V) x the storage dtype's bytes. The
pool pages are ``cache.pool_pages``, or by default ``cache.streams`` x (patch pages ``N_s + W + 1``
+ special pages ``ceil(S * max_total_frames / T)`` + the rollover's preparation headroom ``N_s +
ceil(S * N_s / T)``). At the defaults of the official model (504x378 images: ``T`` = 972) that
is 7.475 GiB in bf16: 6.674 GiB for the stream (special stream sized for one session,
``max_total_frames`` = ``stream.session_keyframes`` = 320) and 0.801 GiB for the next session's
scale pages; docs/gpu_memory.md lists what each setting saves.
"""

from __future__ import annotations

from lingbot_map_ros.config import CacheConfig
from lingbot_map_ros.engine.cache.stream_kv import prep_pages, stream_pages
import torch


def pool_pages(cache: CacheConfig, page_size: int, num_special_tokens: int = 6,
               check_frames: int = 0) -> int:
    """Return the pages (per layer) of the engine's pool: ``cache.pool_pages`` or derived.

    Derived: ``cache.streams`` x (one stream's lease, ``stream_kv.stream_pages``, + the scale
    pages its next session holds while it is prepared, ``stream_kv.prep_pages``), + the pages
    of one more scale pass of ``check_frames`` frames (a loop-closure check: at most one runs
    per engine, beside every stream's rollover preparation). An explicit ``cache.pool_pages``
    is taken as it is.
    """
    if cache.pool_pages:
        return cache.pool_pages
    # Each stream's rollover prepares its next session beside it: the next session's scale
    # frames take their pages from this headroom until the switch (engine/scale_pass.py).
    per_stream = stream_pages(page_size, num_special_tokens, cache.scale_frames,
                              cache.sliding_window, cache.max_total_frames)
    check = prep_pages(page_size, num_special_tokens, check_frames) if check_frames > 0 else 0
    return cache.streams * (per_stream + prep_pages(page_size, num_special_tokens,
                                                    cache.scale_frames)) + check


def kv_cache_bytes(cache: CacheConfig, patches_per_frame: int, num_layers: int = 24,
                   num_heads: int = 16, head_dim: int = 64,
                   num_special_tokens: int = 6) -> int:
    """Return the bytes the KV page pool of ``cache`` allocates (all layers, K and V).

    Args:
        cache: Window sizes, special-stream capacity and storage dtype.
        patches_per_frame: ``T``, patch tokens per frame (``(H/14) * (W/14)`` of the image).
        num_layers: Global attention blocks.
        num_heads: Heads ``H``.
        head_dim: Dims per head ``D``.
        num_special_tokens: ``S`` specials per frame.

    Raises:
        ValueError: ``patches_per_frame`` < 1.
    """
    if patches_per_frame < 1:
        raise ValueError(f'patches_per_frame={patches_per_frame} must be >= 1')
    pages = pool_pages(cache, patches_per_frame, num_special_tokens)
    itemsize = torch.empty(0, dtype=getattr(torch, cache.dtype)).element_size()
    return 2 * num_layers * pages * patches_per_frame * num_heads * head_dim * itemsize


def session_frames(session_keyframes: int, scale_frames: int) -> int:
    """Return the special-stream capacity one session needs: its keyframes plus the scale frames.

    Raises:
        ValueError: ``session_keyframes`` < 1.
    """
    if session_keyframes < 1:
        raise ValueError(f'session_keyframes={session_keyframes} must be >= 1')
    return session_keyframes + scale_frames
