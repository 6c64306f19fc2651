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
"""FlashInfer (and 'sdpa') vs the float32 'reference' backend on CUDA in bfloat16.

Run: ``python -m pytest -m gpu test/engine/test_flashinfer_cache.py`` (repo root). Needs a CUDA
device and FlashInfer (``pip install flashinfer-python``); skipped otherwise. FlashInfer compiles
its kernels on first use (about 15 s per kernel).

Three managers with 16 heads x 64 receive the same bf16 K/V for a stream of keyframes and
non-keyframes (N_s = 2, W = 3), at page sizes 256, 972 (518x378 input) and 999 (518x392).
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
# bf16 storage; FlashInfer and SDPA round P to bf16 in P @ V and the output to bf16. On an H200
# (FlashInfer 0.6.8 fa2/fa3, torch 2.11 cuDNN SDPA) the largest error was 2.7e-3 for outputs up
# to 0.27; leaving out one frame's tokens changes outputs by far more than 1e-2.
ATOL = 1e-2


def _managers(page_size: int, num_blocks: int, backends=('flashinfer', 'sdpa', 'reference')):
    return {name: FlashInferKVCacheManager(
        num_blocks, 0, page_size + SPECIALS, HEADS, HEAD_DIM, torch.bfloat16, 'cuda',
        scale_frames=2, sliding_window=3, max_total_frames=64, backend=name)
        for name in backends}


@pytest.mark.parametrize('page_size', [256, 972, 999])
def test_flashinfer_and_sdpa_match_reference(page_size):
    gen = torch.Generator(device='cuda').manual_seed(page_size)
    managers = _managers(page_size, num_blocks=2)
    tokens = page_size + SPECIALS

    def randn() -> torch.Tensor:
        return torch.randn(tokens, HEADS, HEAD_DIM, device='cuda', generator=gen)

    for _ in range(2):  # phase 1: the scale frames
        k, v = randn().bfloat16(), randn().bfloat16()
        for manager in managers.values():
            for block in range(2):
                manager.append_frame(block, k, v)
    for frame in range(10):
        keyframe = frame % 2 == 0 or frame > 7
        for block in range(2):
            k, v, q = randn().bfloat16(), randn().bfloat16(), randn()
            outs = {}
            for name, manager in managers.items():
                manager.append_frame(block, k, v, keyframe=keyframe)
                if keyframe:
                    manager.evict_frames(block)
                outs[name] = manager.compute_attention(block, q)
                if not keyframe:
                    manager.rollback_last_frame(block)
            expected = outs['reference']
            assert expected.dtype == torch.float32
            assert outs['flashinfer'].dtype == outs['sdpa'].dtype == torch.bfloat16
            torch.testing.assert_close(outs['flashinfer'].float(), expected, atol=ATOL, rtol=0)
            torch.testing.assert_close(outs['sdpa'].float(), expected, atol=ATOL, rtol=0)
    layout = managers['flashinfer'].layout(1)
    assert layout.num_tokens == (2 + 3) * page_size + SPECIALS * 8


def test_flashinfer_plans_once_per_frame_for_all_blocks():
    manager = _managers(256, num_blocks=4, backends=('flashinfer',))['flashinfer']
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
