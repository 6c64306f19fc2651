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
"""The import path of the seed-compatible ``FlashInferKVCacheManager``, kept for its callers.

The class lives in ``seed_api.py``, an adapter beside the cache core. Callers written against
the seed's cache API import it from here or from ``lingbot_map_ros.engine.cache``; the engine's
own code never imports it.
"""

from lingbot_map_ros.engine.cache.seed_api import FlashInferKVCacheManager

__all__ = ['FlashInferKVCacheManager']
