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
"""FlashInferKVCacheManager bookkeeping: golden set B schedule, long random runs, call order.

Run: ``python -m pytest test/engine/test_cache_manager.py`` (repo root; CPU only, a few seconds;
the golden test needs ../shared beside the repository).

The random runs drive several blocks through random sequences of append / evict / attend /
rollback / reset and compare every block's visible pages with an independent model of the
cache semantics (model spec 5.3): which frames keep patches, which specials exist, in which
logical order, plus the physical invariants (no page used twice or leaked, one contiguous run).
"""

import json
import random

from lingbot_map_ros.engine.cache import FlashInferKVCacheManager
from lingbot_map_ros.engine.errors import CachePoolExhaustedError, CacheStateError
import pytest
import torch

SPECIALS = 6


def _manager(num_blocks=2, tokens_per_frame=30, scale_frames=2, sliding_window=3,
             max_total_frames=64, **kwargs) -> FlashInferKVCacheManager:
    return FlashInferKVCacheManager(
        num_blocks=num_blocks, max_num_frames=0, tokens_per_frame=tokens_per_frame,
        num_heads=1, head_dim=2, dtype=torch.float32, device='cpu', scale_frames=scale_frames,
        sliding_window=sliding_window, max_total_frames=max_total_frames,
        backend=kwargs.pop('backend', 'sdpa'), **kwargs)


def _kv(manager: FlashInferKVCacheManager) -> torch.Tensor:
    return torch.randn(manager.tokens_per_frame, manager.num_heads, manager.head_dim)


class SemanticsModel:
    """Which frames are cached and which keep patches, straight from the spec."""

    def __init__(self, scale_frames: int, window: int, capacity: int) -> None:
        self.scale_frames, self.window_size, self.capacity = scale_frames, window, capacity
        self.num_patch_pages = scale_frames + window + 1
        self.reset()

    def reset(self) -> None:
        self.num_frames = 0
        self.scale: list[int] = []
        self.window: list[int] = []

    def append_error(self, eager: bool) -> type | None:
        if self.num_frames == self.capacity:
            return CachePoolExhaustedError
        window = len(self.window)
        if eager and self.num_frames >= self.scale_frames:
            window = min(window, self.window_size - 1)
        if len(self.scale) + window == self.num_patch_pages:
            return CacheStateError
        return None

    def append(self, eager: bool) -> None:
        frame = self.num_frames
        if frame < self.scale_frames:
            self.scale.append(frame)
        else:
            if eager:
                del self.window[:max(0, len(self.window) - self.window_size + 1)]
            self.window.append(frame)
        self.num_frames += 1

    def evict(self) -> None:
        del self.window[:max(0, len(self.window) - self.window_size)]

    def rollback(self) -> None:
        frame = self.num_frames - 1
        if self.scale and self.scale[-1] == frame:
            self.scale.pop()
        elif self.window and self.window[-1] == frame:
            self.window.pop()
        self.num_frames = frame


def _check_layout(manager: FlashInferKVCacheManager, model: SemanticsModel) -> None:
    table = manager.page_table
    page_size = manager.page_size
    layouts = [manager.layout(b) for b in range(manager.num_blocks)]
    assert all(layout is layouts[0] for layout in layouts), 'blocks out of step'
    layout = layouts[0]
    num_patch = len(model.scale) + len(model.window)
    num_special_pages = -(-SPECIALS * model.num_frames // page_size)
    assert (layout.num_frames, layout.num_scale_pages, layout.num_window_pages) == \
        (model.num_frames, len(model.scale), len(model.window))
    ids = layout.page_ids
    assert len(set(ids)) == len(ids) == num_patch + num_special_pages
    # Logical order: scale frames, then window frames (oldest first), then the special stream.
    assert [table.page_owner(p) for p in ids[:num_patch]] == model.scale + model.window
    assert ids[num_patch:] == tuple(range(table.num_patch_pages,
                                          table.num_patch_pages + num_special_pages))
    # No leaked patch page: every used patch page is visible.
    used = [p for p in range(table.num_patch_pages) if table.page_owner(p) >= 0]
    assert sorted(used) == sorted(ids[:num_patch])
    assert table.num_used_special_pages == num_special_pages
    if ids:
        assert layout.is_contiguous and layout.first_page == min(ids)
    num_tokens = num_patch * page_size + SPECIALS * model.num_frames
    assert layout.num_tokens == num_tokens
    if num_special_pages:
        assert layout.last_page_len == SPECIALS * model.num_frames \
            - (num_special_pages - 1) * page_size
    stats = manager.get_cache_stats(manager.num_blocks - 1)
    assert stats['frame_count'] == model.num_frames
    assert stats['special_tokens'] == SPECIALS * model.num_frames
    assert stats['free_pages'] == model.num_patch_pages - num_patch
    assert stats['visible_tokens'] == num_tokens
    assert stats['remaining_frames'] == manager.remaining_frames() \
        == model.capacity - model.num_frames
    assert list(manager.layout(1).page_ids) == list(ids)
    assert manager.layout(0).last_page_len == layout.last_page_len


def _run_calls(manager, calls, block_major: bool) -> None:
    """Run ``calls`` on every block: block by block (the model's order) or call by call."""
    kv = _kv(manager)
    order = [(b, c) for b in range(manager.num_blocks) for c in calls] if block_major else \
        [(b, c) for c in calls for b in range(manager.num_blocks)]
    for block, call in order:
        if call.startswith('append'):
            keyframe = {'append:T': True, 'append:F': False, 'append:N': None}[call]
            manager.append_frame(block, kv, kv, keyframe=keyframe)
        elif call == 'evict':
            manager.evict_frames(block, manager.scale_frames, manager.sliding_window)
        elif call == 'rollback':
            manager.rollback_last_frame(block)
        else:
            assert manager.compute_attention(block, kv).shape == kv.shape


def _random_run(seed: int, num_ops: int, tokens_per_frame: int, scale_frames: int,
                window: int, capacity: int) -> None:
    rng = random.Random(seed)
    manager = _manager(num_blocks=3, tokens_per_frame=tokens_per_frame,
                       scale_frames=scale_frames, sliding_window=window,
                       max_total_frames=capacity)
    model = SemanticsModel(scale_frames, window, capacity)
    for _ in range(num_ops):
        r = rng.random()
        if r < 0.01:
            manager.reset()
            model.reset()
        elif r < 0.45:  # keyframe, hinted or upstream-style
            call = rng.choice(['append:T', 'append:N'])
            error = model.append_error(call == 'append:T')
            if error:
                with pytest.raises(error):
                    manager.append_frame(0, _kv(manager), _kv(manager),
                                         keyframe=call == 'append:T' or None)
                continue
            _run_calls(manager, [call, 'evict', 'attend'], rng.random() < 0.8)
            model.append(call == 'append:T')
            model.evict()
        elif r < 0.8:  # non-keyframe: append -> attend -> rollback, nothing stays
            if model.append_error(False):
                continue
            _run_calls(manager, ['append:F', 'attend', 'rollback'], rng.random() < 0.8)
        else:  # a lone call, as a caller outside the protocol might make
            call = rng.choice(['append:F', 'append:T', 'evict', 'rollback'])
            if call == 'rollback' and model.num_frames == 0:
                with pytest.raises(CacheStateError, match='holds no frame'):
                    manager.rollback_last_frame(0)
                continue
            if call.startswith('append') and model.append_error(call == 'append:T'):
                with pytest.raises(model.append_error(call == 'append:T')):
                    manager.append_frame(0, _kv(manager), _kv(manager),
                                         keyframe=call == 'append:T')
                continue
            _run_calls(manager, [call], rng.random() < 0.5)
            {'append:F': lambda: model.append(False), 'append:T': lambda: model.append(True),
             'evict': model.evict, 'rollback': model.rollback}[call]()
        _check_layout(manager, model)


@pytest.mark.parametrize('seed,tokens_per_frame,scale_frames,window,capacity', [
    (0, 30, 2, 3, 40),    # golden shape: 4 frames of specials per page
    (1, 13, 3, 4, 60),    # page_size 7: specials cross page boundaries
    (2, 8, 1, 1, 30),     # page_size 2: one frame's specials span 3 pages
    (3, 11, 0, 2, 25),    # no scale frames
])
def test_random_sequences_match_the_semantics_model(seed, tokens_per_frame, scale_frames,
                                                    window, capacity):
    _random_run(seed, 1500, tokens_per_frame, scale_frames, window, capacity)


@pytest.mark.parametrize('keyframe_hint', [True, None])
def test_golden_set_b_schedule(keyframe_hint, shared_file):
    golden = json.loads(shared_file('golden', 'stream_B.json').read_text(encoding='utf-8'))
    stream = golden['stream']
    scale_frames, window = stream['num_scale_frames'], stream['sliding_window']
    manager = _manager(num_blocks=3, tokens_per_frame=stream['tokens_per_frame'],
                       scale_frames=scale_frames, sliding_window=window)
    kv = _kv(manager)
    for row in golden['schedule']:
        if row['role'] == 'scale':
            if row['frame'] == 0:  # phase 1: every scale frame appended in each block
                for block in range(manager.num_blocks):
                    for _ in range(scale_frames):
                        manager.append_frame(block, kv, kv)
            keys = manager.layout(0).num_tokens
        else:
            keys = []
            for block in range(manager.num_blocks):
                if row['role'] == 'keyframe':
                    manager.append_frame(block, kv, kv, keyframe=keyframe_hint)
                    manager.evict_frames(block, scale_frames, window)
                else:
                    manager.append_frame(block, kv, kv, keyframe=False)
                keys.append(manager.layout(block).num_tokens)
                manager.compute_attention(block, kv)
                if row['role'] == 'non-keyframe':
                    manager.rollback_last_frame(block)
            assert len(set(keys)) == 1
            keys = keys[0]
        assert keys == row['attended_keys_global_block'], row
        stats = manager.get_cache_stats(2)
        after = row['cache_after_call']
        assert (stats['scale_pages'], stats['live_pages'], stats['special_tokens'],
                stats['frame_count']) == (after['scale_frames_with_patches'],
                                          after['window_frames_with_patches'],
                                          after['special_tokens'], after['frames_cached'])


def test_blocks_replay_the_leaders_steps_and_see_their_own_layout():
    manager = _manager(num_blocks=2)
    kv = _kv(manager)
    manager.append_frame(0, kv, kv)
    manager.append_frame(0, kv, kv)
    # Block 1 has not appended anything yet: it sees an empty cache.
    assert manager.layout(1).num_frames == 0 and manager.layout(0).num_frames == 2
    with pytest.raises(CacheStateError, match='holds no frame'):
        manager.compute_attention(1, kv)
    manager.append_frame(1, kv, kv)
    assert manager.layout(1).num_frames == 1
    with pytest.raises(CacheStateError, match='block 1 calls evict at cache step 1'):
        manager.evict_frames(1)
    manager.append_frame(1, kv, kv)
    assert manager.layout(1) is manager.layout(0)
    manager.append_frame(0, kv, kv, keyframe=True)
    with pytest.raises(CacheStateError, match=r'made append\(keyframe=True\)'):
        manager.append_frame(1, kv, kv, keyframe=False)


def test_reset_puts_every_block_back_at_the_start():
    manager = _manager(num_blocks=2)
    kv = _kv(manager)
    manager.append_frame(0, kv, kv)
    manager.reset()
    manager.append_frame(1, kv, kv)  # block 1 now leads
    assert manager.layout(1).num_frames == 1 and manager.layout(0).num_frames == 0
    manager.append_frame(0, kv, kv)
    assert manager.layout(0) is manager.layout(1)


def test_a_block_that_never_follows_is_reported():
    manager = _manager(num_blocks=2)
    kv = _kv(manager)
    with pytest.raises(CacheStateError, match='block 1 is at cache step 0'):
        for _ in range(5000):
            manager.append_frame(0, kv, kv, keyframe=False)
            manager.rollback_last_frame(0)
    # The refused call changed nothing: block 0 and the table still agree.
    assert manager.layout(0).num_frames == manager.page_table.num_frames == 0


def test_pool_exhaustion_names_max_total_frames():
    manager = _manager(num_blocks=2, max_total_frames=4)
    kv = _kv(manager)
    for _ in range(4):
        for block in range(2):
            manager.append_frame(block, kv, kv, keyframe=True)
            manager.evict_frames(block)
    assert manager.remaining_frames() == 0
    with pytest.raises(CachePoolExhaustedError, match='max_total_frames=4'):
        manager.append_frame(0, kv, kv, keyframe=False)


def test_upstream_flags_and_bad_arguments():
    manager = _manager()
    kv = _kv(manager)
    manager.defer_eviction = True  # what upstream's block does around a non-keyframe
    with pytest.raises(ValueError, match='defer_eviction is set'):
        manager.append_frame(0, kv, kv, keyframe=True)
    manager.defer_eviction = False
    with pytest.raises(ValueError, match=r'block_idx=2 is outside \[0, 2\)'):
        manager.append_frame(2, kv, kv)
    with pytest.raises(ValueError, match=r'must be \[P, H, D\] = \(30, 1, 2\)'):
        manager.append_frame(0, kv[:29], kv[:29])
    with pytest.raises(ValueError, match='built for scale_frames=2, sliding_window=3'):
        manager.evict_frames(0, 2, 4)
    with pytest.raises(ValueError, match='camera_only=False'):
        manager.evict_frames(0, camera_only=True)
    with pytest.raises(ValueError, match=r'q \(30, 2, 1\)'):
        manager.compute_attention(0, kv.transpose(1, 2))
    with pytest.raises(ValueError, match='tokens_per_frame=6 must exceed'):
        _manager(tokens_per_frame=6)
    with pytest.raises(ValueError, match="backend='dense'"):
        _manager(backend='dense')
    with pytest.raises(ValueError, match='needs a CUDA device'):
        _manager(backend='flashinfer')
    with pytest.raises(ValueError, match="backend 'flashinfer'"):
        FlashInferKVCacheManager(1, 0, 30, 1, 2, torch.bfloat16, 'cuda', force_fp32=True,
                                 backend='flashinfer')


def test_force_fp32_is_the_reference_backend_in_float32():
    manager = FlashInferKVCacheManager(1, 0, 30, 1, 2, torch.bfloat16, 'cpu', force_fp32=True)
    assert (manager.backend_name, manager.dtype) == ('reference', torch.float32)
    manager = FlashInferKVCacheManager(1, 0, 30, 1, 2, 'float64', 'cpu', force_fp32=True)
    assert manager.dtype == torch.float64
    # K and V x (8 + 64 + 1 patch pages + ceil(2048 * 6 / 24) special pages) x 24 tokens
    # x 1 head x 2 dims x 8 bytes.
    assert manager.get_cache_stats()['kv_bytes'] == manager.kv_bytes == \
        2 * (8 + 64 + 1 + 512) * 24 * 1 * 2 * 8
    # An explicit backend wins; force_fp32 still keeps the storage float32.
    manager = FlashInferKVCacheManager(1, 0, 30, 1, 2, torch.bfloat16, 'cpu', force_fp32=True,
                                       backend='sdpa')
    assert (manager.backend_name, manager.dtype) == ('sdpa', torch.float32)
