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
"""FP8 (e4m3) KV storage: written as FP8, widened on read, same attention up to e4m3 rounding.

Each backend and staged form over an FP8 pool against the ``reference`` backend on the same
pages: test_attention_conformance.py.
"""

from lingbot_map_ros.config import CacheConfig
from lingbot_map_ros.engine.attention.fp8 import kernel_operand_dtype
from lingbot_map_ros.engine.cache.manager import FlashInferKVCacheManager
from lingbot_map_ros.engine.cache.stream_kv import stream_pages
import pytest
import torch

P, H, D, S = 30, 4, 16, 6
FP8 = torch.float8_e4m3fn


def _stream(storage_dtype, backend='sdpa', frames=9):
    """Keyframes 0..frames-1 through 2 blocks; the attention outputs and the manager."""
    cache = FlashInferKVCacheManager(2, 100, P, H, D, torch.float32, 'cpu', num_special_tokens=S,
                                     scale_frames=2, sliding_window=3, max_total_frames=20,
                                     backend=backend, storage_dtype=storage_dtype)
    gen = torch.Generator().manual_seed(7)
    outs = []
    for frame in range(frames):
        for block in range(2):
            k, v, q = (torch.randn(P, H, D, generator=gen) for _ in range(3))
            cache.append_frame(block, k, v, keyframe=True)
            if frame >= 2:
                cache.evict_frames(block)
            outs.append(cache.compute_attention(block, q))
    return torch.stack(outs), cache


@pytest.mark.parametrize('backend', ['sdpa', 'reference'])
def test_fp8_storage_matches_float32_up_to_e4m3_rounding(backend):
    ref, _ = _stream(None, backend)
    out, cache = _stream(FP8, backend)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    rel = ((out - ref).norm() / ref.norm()).item()
    # e4m3 keeps 3 mantissa bits: ~2^-4 relative rounding of each K/V element, so a few
    # percent here; a wrong widening (e.g. bytes read as integers) is off by orders more.
    assert 1e-3 < rel < 0.08
    assert cache.get_cache_stats()['dtype'] == 'float8_e4m3fn'


def test_fp8_storage_holds_the_written_values_in_e4m3():
    _, cache = _stream(FP8, frames=1)
    stored = cache.storage.k[0]  # the bytes themselves are the point
    assert stored.dtype == FP8
    gen = torch.Generator().manual_seed(7)
    k = torch.randn(P, H, D, generator=gen)
    page = cache.layout(0).page_ids[0]
    assert torch.equal(stored[page].float(), k[S:].to(FP8).float())


def test_fp8_storage_is_a_quarter_of_float32_and_half_of_bf16():
    _, fp32 = _stream(None, frames=1)
    _, fp8 = _stream(FP8, frames=1)
    assert fp32.kv_bytes == 4 * fp8.kv_bytes


def test_fp8_refusals_are_clear():
    with pytest.raises(ValueError, match="not wired to backend 'flashinfer'"):
        FlashInferKVCacheManager(1, 10, P, H, D, torch.bfloat16, 'cpu', num_special_tokens=S,
                                 backend='flashinfer', storage_dtype=FP8)
    with pytest.raises(ValueError, match='must be the attention dtype'):
        FlashInferKVCacheManager(1, 10, P, H, D, torch.float32, 'cpu', num_special_tokens=S,
                                 backend='sdpa', storage_dtype=torch.float16)


def test_cache_config_takes_fp8():
    assert CacheConfig(dtype='float8_e4m3fn').dtype == 'float8_e4m3fn'


@pytest.mark.parametrize('dtype', ['bfloat16', 'float8_e4m3fn', 'float32'])
def test_kv_cache_bytes_predicts_what_the_manager_allocates(dtype):
    from lingbot_map_ros.engine.cache.capacity import kv_cache_bytes, session_frames
    cfg = CacheConfig(scale_frames=2, sliding_window=3, max_total_frames=session_frames(20, 2),
                      dtype=dtype)
    fp8 = dtype == 'float8_e4m3fn'
    cache = FlashInferKVCacheManager(
        3, 100, P, H, D, torch.float32 if fp8 else getattr(torch, dtype), 'cpu',
        num_special_tokens=S, scale_frames=2, sliding_window=3,
        max_total_frames=cfg.max_total_frames, backend='sdpa', storage_dtype=FP8 if fp8 else None)
    # The manager holds one stream; the engine's pool adds that stream's rollover headroom.
    from lingbot_map_ros.engine.cache.stream_kv import prep_pages
    stream = stream_pages(P - S, S, 2, 3, cfg.max_total_frames)
    pool_bytes = cache.kv_bytes * (stream + prep_pages(P - S, S, 2)) // stream
    assert kv_cache_bytes(cfg, P - S, num_layers=3, num_heads=H, head_dim=D,
                          num_special_tokens=S) == pool_bytes


def test_kv_cache_bytes_of_the_official_defaults_and_the_small_gpu_config():
    from lingbot_map_ros.engine.cache.capacity import kv_cache_bytes
    gib = 2 ** 30
    # 8 + 64 + 1 patch pages + 2 special pages (320 keyframes) + the next session's 8 scale
    # pages and their special page (rollover headroom), bf16; 6.674 + 0.801 GiB on the H200.
    assert kv_cache_bytes(CacheConfig(), 972) == 2 * 24 * (75 + 9) * 972 * 16 * 64 * 2
    assert kv_cache_bytes(CacheConfig(), 972) / gib == pytest.approx(7.475, abs=1e-3)
    small = CacheConfig(sliding_window=24, dtype='float8_e4m3fn')
    # 8 + 24 + 1 patch pages + 2 special pages + 9 headroom pages, one byte per element.
    assert kv_cache_bytes(small, 972) == 2 * 24 * (35 + 9) * 972 * 16 * 64


def test_the_triton_kernel_widens_fp8_kv_to_fp16_and_nothing_else():
    f8, bf16, f16 = torch.float8_e4m3fn, torch.bfloat16, torch.float16
    assert kernel_operand_dtype(bf16, f8, f8) == f16
    assert kernel_operand_dtype(f16, f8, f8) == f16
    # The bf16 path is unchanged: bf16 storage (or only one of K, V in FP8) stays in bf16.
    assert kernel_operand_dtype(bf16, bf16, bf16) == bf16
    assert kernel_operand_dtype(bf16, f8, bf16) == bf16
    assert kernel_operand_dtype(f16, f16, f16) == f16
    # Every e4m3 value is exact in fp16: the widening loses nothing.
    every = torch.arange(256, dtype=torch.uint8).view(f8)
    finite = every.float().isfinite()
    assert torch.equal(every.to(f16).float()[finite], every.float()[finite])


def test_the_triton_kernel_dtype_refuses_what_it_cannot_read():
    f8 = torch.float8_e4m3fn
    with pytest.raises(ValueError, match='queries must be bf16 or fp16'):
        kernel_operand_dtype(torch.float32, f8, f8)
    with pytest.raises(ValueError, match='v is torch.float32'):
        kernel_operand_dtype(torch.bfloat16, f8, torch.float32)


def test_pool_pages_make_room_for_one_check_pass_beside_every_stream():
    from dataclasses import replace

    from lingbot_map_ros.config import CacheConfig
    from lingbot_map_ros.engine.cache.capacity import pool_pages
    from lingbot_map_ros.engine.cache.stream_kv import prep_pages, stream_pages
    page = 972
    cache = CacheConfig(streams=2)
    per_stream = stream_pages(page, 6, 8, 64, 320) + prep_pages(page, 6, 8)
    assert pool_pages(cache, page) == 2 * per_stream
    # One loop-closure check of 4 frames: its patch pages and one special page, once per pool.
    assert pool_pages(cache, page, check_frames=4) == 2 * per_stream + 4 + 1
    assert pool_pages(replace(cache, pool_pages=50), page, check_frames=4) == 50
