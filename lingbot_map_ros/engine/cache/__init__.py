"""The engine's paged two-stream KV cache (see ``manager.py`` for the protocol)."""

from lingbot_map_ros.engine.cache.manager import FlashInferKVCacheManager
from lingbot_map_ros.engine.cache.page_pool import PagePool
from lingbot_map_ros.engine.cache.page_table import PageLayout, PageMove, TableStep, \
    TwoStreamPageTable
from lingbot_map_ros.engine.cache.stream_cache import new_stream_cache, tokens_per_frame

__all__ = ['FlashInferKVCacheManager', 'PageLayout', 'PageMove', 'PagePool', 'TableStep',
           'TwoStreamPageTable', 'new_stream_cache', 'tokens_per_frame']
