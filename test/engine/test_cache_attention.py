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
"""Cache attention ('sdpa', 'reference') vs naive dense attention over the visible token set.

Run: ``python -m pytest test/engine/test_cache_attention.py`` (repo root; CPU only, a few
seconds).

The test keeps every appended frame's K/V per block and builds the visible set itself: all
tokens of frames that keep their patches (scale frames and window keyframes), and the specials
of every cached frame. The expected output is softmax(q k^T / sqrt(D)) v in float64.
"""

import math
import random
import sys

from lingbot_map_ros.engine.attention.backend import make_backend
from lingbot_map_ros.engine.attention.flashinfer import import_flashinfer
from lingbot_map_ros.engine.attention.sdpa import ReferenceBackend, SdpaBackend
from lingbot_map_ros.engine.cache import FlashInferKVCacheManager, PageLayout
import pytest
import torch

HEADS, HEAD_DIM, SPECIALS = 2, 8, 6


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[Q, H, D]`` x ``[K, H, D]`` -> ``[Q, H, D]`` in float64, no mask."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.einsum('qhd,khd->hqk', q, k) / math.sqrt(q.shape[-1])
    return torch.einsum('hqk,khd->qhd', scores.softmax(dim=-1), v)


class Frame:
    def __init__(self, k: list, v: list) -> None:
        self.k, self.v, self.patches = k, v, True


class VisibleSet:
    """Cached frames with their per-block K/V and whether they still hold patches."""

    def __init__(self, scale_frames: int, window: int) -> None:
        self.scale_frames, self.window = scale_frames, window
        self.frames: list[Frame] = []

    def _window_frames(self) -> list[Frame]:
        return [f for f in self.frames[self.scale_frames:] if f.patches]

    def append(self, frame: Frame, eager: bool) -> None:
        if eager and len(self.frames) >= self.scale_frames:
            for old in self._window_frames()[:-self.window + 1 or None]:
                old.patches = False
        self.frames.append(frame)

    def evict(self) -> None:
        for old in self._window_frames()[:-self.window]:
            old.patches = False

    def keys_values(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        ks = [f.k[block][SPECIALS:] for f in self.frames if f.patches]
        vs = [f.v[block][SPECIALS:] for f in self.frames if f.patches]
        ks += [f.k[block][:SPECIALS] for f in self.frames]
        vs += [f.v[block][:SPECIALS] for f in self.frames]
        return torch.cat(ks), torch.cat(vs)


def _check(manager, visible: VisibleSet, q: torch.Tensor, block: int, atol: float) -> None:
    layout = manager.layout(block)
    k, v = visible.keys_values(block)
    assert layout.num_tokens == k.shape[0] and layout.is_contiguous
    out = manager.compute_attention(block, q[block])
    torch.testing.assert_close(out.double(), naive_attention(q[block], k, v),
                               atol=atol, rtol=0)


def _random_stream(backend: str, dtype: torch.dtype, atol: float, seed: int,
                   tokens_per_frame: int = 13, num_blocks: int = 2,
                   num_frames: int = 40) -> None:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    scale_frames, window = 2, 3
    manager = FlashInferKVCacheManager(
        num_blocks, 0, tokens_per_frame, HEADS, HEAD_DIM, dtype, 'cpu',
        scale_frames=scale_frames, sliding_window=window, max_total_frames=num_frames + 2,
        backend=backend)
    visible = VisibleSet(scale_frames, window)

    def new_frame() -> Frame:
        shape = (num_blocks, tokens_per_frame, HEADS, HEAD_DIM)
        k, v = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
        return Frame(list(k), list(v))

    for _ in range(scale_frames):
        frame = new_frame()
        for block in range(num_blocks):
            manager.append_frame(block, frame.k[block], frame.v[block])
        visible.append(frame, eager=False)
    for _ in range(num_frames):
        frame = new_frame()
        q = torch.randn((num_blocks, tokens_per_frame, HEADS, HEAD_DIM), generator=gen)
        kind = rng.choice(['key:T', 'key:N', 'non', 'key-then-rollback'])
        if kind == 'non':
            visible.append(frame, eager=False)
        for block in range(num_blocks):
            if kind == 'non':
                manager.append_frame(block, frame.k[block], frame.v[block], keyframe=False)
                _check(manager, visible, q, block, atol)
                manager.rollback_last_frame(block)
                continue
            manager.append_frame(block, frame.k[block], frame.v[block],
                                 keyframe=True if kind == 'key:T' else None)
            manager.evict_frames(block)
            if block == 0:
                visible.append(frame, eager=True)
            _check(manager, visible, q, block, atol)
            if kind == 'key-then-rollback':
                # Outside the model's protocol: forces page moves inside the run.
                manager.rollback_last_frame(block)
        if kind in ('non', 'key-then-rollback'):
            visible.frames.pop()


@pytest.mark.parametrize('backend,dtype,atol', [
    ('sdpa', torch.float64, 1e-12),
    ('sdpa', torch.float32, 2e-6),
    ('reference', torch.float32, 2e-6),
    ('reference', torch.float64, 1e-12),
])
def test_random_stream_matches_naive_attention(backend, dtype, atol):
    _random_stream(backend, dtype, atol, seed=7)


def test_specials_crossing_pages_and_page_size_one():
    _random_stream('sdpa', torch.float64, 1e-12, seed=3, tokens_per_frame=7, num_frames=25)


def test_sdpa_keeps_float64_and_reference_upcasts_bfloat16():
    q = torch.randn(13, HEADS, HEAD_DIM, dtype=torch.float64)
    for backend, dtype, expected in (('sdpa', torch.float64, torch.float64),
                                     ('sdpa', torch.bfloat16, torch.bfloat16),
                                     ('reference', torch.bfloat16, torch.float32)):
        manager = FlashInferKVCacheManager(1, 0, 13, HEADS, HEAD_DIM, dtype, 'cpu',
                                           scale_frames=1, max_total_frames=4,
                                           backend=backend)
        manager.append_frame(0, q.to(dtype), q.to(dtype))
        assert manager.compute_attention(0, q).dtype == expected


def test_sdpa_gathers_a_layout_that_is_not_contiguous():
    page_size = 3
    k_pages = torch.randn(6, page_size, HEADS, HEAD_DIM, dtype=torch.float64)
    v_pages = torch.randn(6, page_size, HEADS, HEAD_DIM, dtype=torch.float64)
    q = torch.randn(4, HEADS, HEAD_DIM, dtype=torch.float64)
    # Pages 4, 1, then 2 holding 2 tokens: a gap (3), so no single token range.
    layout = PageLayout.build((4, 1, 2), page_size, 2, 0, 0, 0, version=1)
    assert not layout.is_contiguous
    k = torch.cat([k_pages[4], k_pages[1], k_pages[2][:2]])
    v = torch.cat([v_pages[4], v_pages[1], v_pages[2][:2]])
    for backend in (SdpaBackend(), ReferenceBackend()):
        backend.plan(layout, q.shape[0])
        torch.testing.assert_close(backend.run(q, k_pages, v_pages, layout),
                                   naive_attention(q, k, v), atol=1e-12, rtol=0)


def test_flashinfer_missing_is_an_import_error_with_a_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, 'flashinfer', None)  # makes 'import flashinfer' fail
    with pytest.raises(ImportError, match='pip install flashinfer-python'):
        import_flashinfer()


def test_make_backend_refuses_what_flashinfer_cannot_do():
    kwargs = {'num_heads': HEADS, 'head_dim': HEAD_DIM, 'page_size': 4, 'num_pages': 8}
    with pytest.raises(ValueError, match='needs a CUDA device'):
        make_backend('flashinfer', dtype=torch.bfloat16, device=torch.device('cpu'), **kwargs)
    with pytest.raises(ValueError, match='stores bfloat16 or float16'):
        make_backend('flashinfer', dtype=torch.float32, device=torch.device('cuda'), **kwargs)
    with pytest.raises(ValueError, match="'fast' is not one of"):
        make_backend('fast', dtype=torch.float32, device=torch.device('cpu'), **kwargs)
