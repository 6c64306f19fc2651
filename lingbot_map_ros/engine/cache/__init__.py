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
"""The engine's paged two-stream KV cache: one page pool per engine, one table per stream.

``FlashInferKVCacheManager``, the seed's per-block cache API (``seed_api.py``, an adapter over
this core), is importable from here as in the seed, but loaded only when asked for: the engine
never uses it.
"""

from typing import Any

from lingbot_map_ros.engine.cache.kv_pool import KVPool, PageLease, PoolStats
from lingbot_map_ros.engine.cache.page_pool import PagePool
from lingbot_map_ros.engine.cache.page_table import PageLayout, PageMove, TableStep, \
    TwoStreamPageTable
from lingbot_map_ros.engine.cache.stream_cache import new_kv_pool, tokens_per_frame
from lingbot_map_ros.engine.cache.stream_kv import FramePlan, StreamKV

__all__ = ['FlashInferKVCacheManager', 'FramePlan', 'KVPool', 'PageLayout', 'PageLease',
           'PageMove', 'PagePool', 'PoolStats', 'StreamKV', 'TableStep', 'TwoStreamPageTable',
           'new_kv_pool', 'tokens_per_frame']


def __getattr__(name: str) -> Any:
    """Return the seed's adapter class on first use (the package's other names load eagerly)."""
    if name == 'FlashInferKVCacheManager':
        from lingbot_map_ros.engine.cache.seed_api import FlashInferKVCacheManager
        return FlashInferKVCacheManager
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
