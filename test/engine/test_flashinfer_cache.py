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
"""FlashInfer's own behaviour: one kernel plan per frame for every block.

Run: ``python -m pytest -m gpu test/engine/test_flashinfer_cache.py`` (repo root). Needs a CUDA
device and FlashInfer (``pip install flashinfer-python``); skipped otherwise. FlashInfer compiles
its kernels on first use (about 15 s per kernel). Its output against the ``reference`` backend
(bf16 and fp16, through the window fill, at 32 and 972 patches a page):
test_attention_conformance.py.
"""

import importlib.util

from lingbot_map_ros.engine.cache import FlashInferKVCacheManager
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA'),
    pytest.mark.skipif(importlib.util.find_spec('flashinfer') is None,
                       reason='needs flashinfer (pip install flashinfer-python)'),
]

HEADS, HEAD_DIM, SPECIALS = 16, 64, 6


def _manager(page_size: int, num_blocks: int) -> FlashInferKVCacheManager:
    return FlashInferKVCacheManager(
        num_blocks, 0, page_size + SPECIALS, HEADS, HEAD_DIM, torch.bfloat16, 'cuda',
        scale_frames=2, sliding_window=3, max_total_frames=64, backend='flashinfer')


def test_flashinfer_plans_once_per_frame_for_all_blocks():
    manager = _manager(256, num_blocks=4)
    planned = manager.backend.num_plans
    kv = torch.randn(256 + SPECIALS, HEADS, HEAD_DIM, device='cuda', dtype=torch.bfloat16)
    for block in range(4):
        manager.append_frame(block, kv, kv)
    for frame in range(6):
        for block in range(4):
            manager.append_frame(block, kv, kv, keyframe=frame % 2 == 0)
            if frame % 2 == 0:
                manager.evict_frames(block)
            manager.compute_attention(block, kv)
            if frame % 2:
                manager.rollback_last_frame(block)
    assert manager.backend.num_plans - planned == 6
