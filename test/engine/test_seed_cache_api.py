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
"""The seed-compatible cache API is an adapter: importable where it was, not loaded by the engine.

Its behaviour is checked by ``test_cache_manager.py`` and the attention tests; here only where
it lives. Run: ``python -m pytest test/engine/test_seed_cache_api.py`` (a few seconds).
"""

from pathlib import Path
import subprocess
import sys

import pytest


def test_both_import_paths_give_the_adapter_class():
    from lingbot_map_ros.engine.cache import FlashInferKVCacheManager as from_package
    from lingbot_map_ros.engine.cache.manager import FlashInferKVCacheManager as from_manager
    from lingbot_map_ros.engine.cache.seed_api import FlashInferKVCacheManager
    assert from_package is FlashInferKVCacheManager
    assert from_manager is FlashInferKVCacheManager
    import lingbot_map_ros.engine.cache as cache
    assert 'FlashInferKVCacheManager' in cache.__all__
    with pytest.raises(AttributeError, match='NoSuchName'):
        getattr(cache, 'NoSuchName')


# A fresh interpreter: this process has loaded the adapter already (the test above).
_ENGINE_RUN = """
import sys
sys.path.insert(0, {here!r})
from tiny_engine import random_frames, tiny_session
session = tiny_session({{'cache.scale_frames': 2, 'cache.sliding_window': 2}})
preds = [p for i, frame in enumerate(random_frames(4)) for p in session.step(frame, i)]
assert len(preds) == 4, len(preds)
print(sorted(m for m in sys.modules if m.startswith('lingbot_map_ros.engine.cache')))
"""


def test_an_engine_session_never_loads_the_adapter():
    here = str(Path(__file__).resolve().parent)
    result = subprocess.run([sys.executable, '-c', _ENGINE_RUN.format(here=here)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.strip().splitlines()[-1]
    assert 'lingbot_map_ros.engine.cache.stream_kv' in loaded  # the core did run
    assert 'seed_api' not in loaded and 'cache.manager' not in loaded
    assert 'step_log' not in loaded
