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
"""Staged frames: the cache work of a frame with its numbers on the device equals the eager calls.

A staged frame plans all blocks' cache work at once on its stream (``stage_frame``), then
writes and attends per block from device tensors (``write``, ``attend``), so a whole frame can
be one CUDA graph. On the CPU the staged attention reads its range on the host; it must give
the same outputs, layouts and counters as the eager ``append_frame`` / ``evict_frames`` /
``compute_attention`` / ``rollback_last_frame`` sequence through the window fill and past it.
On CUDA (marker gpu) the same sequence runs from one captured graph replayed every frame.

Run: ``python -m pytest test/engine/test_staged_frames.py`` (about a second on the CPU).
"""

from __future__ import annotations

from lingbot_map_ros.engine.cache import FlashInferKVCacheManager, KVPool, StreamKV
from lingbot_map_ros.engine.cache.staged_frames import can_stage, StagedFrames
from lingbot_map_ros.engine.cache.stream_kv import stream_pages
from lingbot_map_ros.engine.errors import CacheStateError
import pytest
import torch

BLOCKS, HEADS, DIM, SPECIALS, PATCHES = 3, 2, 8, 6, 10
SCALE, WINDOW = 2, 3


def _manager(device: str = 'cpu', dtype: torch.dtype = torch.float64,
             backend: str = 'sdpa', dim: int = DIM) -> FlashInferKVCacheManager:
    return FlashInferKVCacheManager(BLOCKS, 64, SPECIALS + PATCHES, HEADS, dim, dtype, device,
                                    num_special_tokens=SPECIALS, scale_frames=SCALE,
                                    sliding_window=WINDOW, max_total_frames=32, backend=backend)


def _stream_kv(device: str = 'cpu', dtype: torch.dtype = torch.float64,
               backend: str = 'sdpa', dim: int = DIM) -> StreamKV:
    # A pool of exactly one stream's pages: its counters equal the manager's.
    pages = stream_pages(PATCHES, SPECIALS, SCALE, WINDOW, 32)
    pool = KVPool(num_layers=BLOCKS, num_pages=pages, page_size=PATCHES, num_heads=HEADS,
                  head_dim=dim, num_special_tokens=SPECIALS, dtype=dtype,
                  device=torch.device(device), backend=backend,
                  full_patch_pages=SCALE + WINDOW)
    return StreamKV(pool, SCALE, WINDOW, 32)


def _frames(num: int, device: str, dtype: torch.dtype, dim: int = DIM) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    # [frame, block, q/k/v, P, H, D]
    return torch.randn(num, BLOCKS, 3, SPECIALS + PATCHES, HEADS, dim, generator=gen,
                       dtype=torch.float64).to(device, dtype)


def _scale_pass(cache: FlashInferKVCacheManager, frames: torch.Tensor) -> None:
    for f in range(SCALE):
        for b in range(BLOCKS):
            cache.append_frame(b, frames[f, b, 1], frames[f, b, 2], keyframe=True)


def _scale_plan(kv: StreamKV, frames: torch.Tensor) -> None:
    # The scale frames planned once, written per block (what the aggregator does).
    plan = kv.plan_frame('scale', SCALE)
    for b in range(BLOCKS):
        kv.write(plan, b, frames[:SCALE, b, 1].flatten(0, 1), frames[:SCALE, b, 2].flatten(0, 1))
    kv.end_frame(plan)


def _eager_frame(cache: FlashInferKVCacheManager, frame: torch.Tensor,
                 keyframe: bool) -> list[torch.Tensor]:
    outs = []
    for b in range(BLOCKS):
        cache.append_frame(b, frame[b, 1], frame[b, 2], keyframe=keyframe)
        if keyframe:
            cache.evict_frames(b)
        outs.append(cache.compute_attention(b, frame[b, 0]).clone())
        if not keyframe:
            cache.rollback_last_frame(b)
    return outs


def _staged_frame(staging: StagedFrames, kv: StreamKV, frame: torch.Tensor,
                  keyframe: bool) -> list[torch.Tensor]:
    key = staging.stage_frame(kv, keyframe)
    outs = []
    for b in range(BLOCKS):
        staging.write(b, frame[b, 1], frame[b, 2])
        outs.append(staging.attend(b, key, frame[b, 0]).clone())
    staging.finish()
    return outs


# Keyframes and non-keyframes through the window fill (5 patch pages) and well past it.
SCHEDULE = [True, False, True, True, False, True, True, False, False, True, True, False, True]


def test_staged_frames_equal_the_eager_calls_through_and_past_the_window_fill():
    frames = _frames(SCALE + len(SCHEDULE), 'cpu', torch.float64)
    eager, staged = _manager(), _stream_kv()
    staging = StagedFrames(staged.pool)
    _scale_pass(eager, frames)
    _scale_plan(staged, frames)
    for i, keyframe in enumerate(SCHEDULE):
        frame = frames[SCALE + i]
        want = _eager_frame(eager, frame, keyframe)
        got = _staged_frame(staging, staged, frame, keyframe)
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a, atol=0, rtol=0)
        assert staged.table.layout.page_ids == eager.layout(0).page_ids
        assert staged.stats() == eager.get_cache_stats(BLOCKS - 1)
    # The run really went past the fill: a full window, frames evicted, non-keyframes gone.
    stats = staged.stats()
    assert stats['live_pages'] == WINDOW
    assert stats['frame_count'] == SCALE + sum(SCHEDULE)


def test_staged_keys_on_the_cpu_are_the_range_kind():
    kv = _stream_kv()
    staging = StagedFrames(kv.pool)
    _scale_plan(kv, _frames(SCALE, 'cpu', torch.float64))
    assert staging.stage_frame(kv, True) == ('range',)
    staging.finish()
    assert staging.stage_placeholder(kv, False) == ('range',)


def test_staging_refuses_out_of_order_calls_and_unsupported_backends():
    kv = _stream_kv()
    staging = StagedFrames(kv.pool)
    _scale_plan(kv, _frames(SCALE, 'cpu', torch.float64))
    with pytest.raises(CacheStateError, match='without a staged frame'):
        staging.finish()
    staging.stage_frame(kv, False)
    with pytest.raises(CacheStateError, match='in flight'):
        staging.stage_frame(kv, True)
    staging.finish()
    assert kv.stats()['frame_count'] == SCALE  # the non-keyframe rolled back
    assert can_stage(kv.pool) and kv.pool.backend.graph_support == 'whole_frame'
    reference = _stream_kv(backend='reference')
    assert not can_stage(reference.pool)
    assert reference.pool.backend.graph_support == 'segments'
    with pytest.raises(CacheStateError, match='whole-frame backend'):
        StagedFrames(reference.pool)
    with pytest.raises(CacheStateError, match='another pool'):
        staging.stage_frame(_stream_kv(), True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_one_captured_graph_replays_every_staged_frame_on_cuda():
    # bf16 on CUDA: flash varlen over a device-side range while the window fills, cuDNN +
    # flash once it is full. One graph per key, captured once, replayed for every later frame.
    # Head dim 64, the model's (cuDNN refuses very small ones).
    from lingbot_map_ros.engine.runner.captured import capture_graph

    frames = _frames(SCALE + len(SCHEDULE), 'cuda', torch.bfloat16, dim=64)
    eager, staged = _manager('cuda', torch.bfloat16, dim=64), \
        _stream_kv('cuda', torch.bfloat16, dim=64)
    staging = StagedFrames(staged.pool)
    _scale_pass(eager, frames)
    _scale_plan(staged, frames)
    current = frames[0].clone()  # the graph's static input
    graphs: dict = {}

    def body(key):
        outs = []
        for b in range(BLOCKS):
            staging.write(b, current[b, 1], current[b, 2])
            outs.append(staging.attend(b, key, current[b, 0]))
        return outs

    keys = set()
    for i, keyframe in enumerate(SCHEDULE):
        frame = frames[SCALE + i]
        want = _eager_frame(eager, frame, keyframe)
        current.copy_(frame)
        key = staging.stage_frame(staged, keyframe)
        keys.add(key)
        if key not in graphs:
            graphs[key] = capture_graph(lambda: body(key))
        graph, out = graphs[key]
        graph.replay()
        staging.finish()
        for a, b in zip(want, out):
            assert (b.float() - a.float()).abs().max() < 2e-2
    assert ('range',) in keys and any(k[0] == 'split' for k in keys)
