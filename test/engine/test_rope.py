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
"""2-D (frame) and 3-D video (global) RoPE against the spec's per-element formulas.

Run: ``python -m pytest test/engine/test_rope.py`` from the repository root (CPU, < 1 s).
The expected values are computed element by element with Python floats (spec §4.3, §4.4).
"""

import math

from lingbot_map_ros.engine.model.layers import rope as rope_module
from lingbot_map_ros.engine.model.layers.rope import (FrameRope, rotate_half_2d,
                                                      rotate_interleaved, VideoRope)
import pytest
import torch

D = 64


def _rotate(a: float, b: float, angle: float) -> tuple[float, float]:
    return a * math.cos(angle) - b * math.sin(angle), b * math.cos(angle) + a * math.sin(angle)


def _frame_rope_reference(q: list[float], row: int, col: int) -> list[float]:
    out = list(q)
    for half, pos in ((0, row), (1, col)):
        for i in range(16):
            angle = pos * 100.0 ** (-2 * i / 32)
            lo, hi = 32 * half + i, 32 * half + i + 16
            out[lo], out[hi] = _rotate(q[lo], q[hi], angle)
    return out


def _video_rope_reference(q: list[float], t: int, row: int, col: int) -> list[float]:
    out = list(q)
    for k in range(32):
        if k < 10:
            angle = t * 10000.0 ** (-2 * k / 20)
        elif k < 21:
            angle = row * 10000.0 ** (-2 * (k - 10) / 22)
        else:
            angle = col * 10000.0 ** (-2 * (k - 21) / 22)
        out[2 * k], out[2 * k + 1] = _rotate(q[2 * k], q[2 * k + 1], angle)
    return out


def test_frame_rope_matches_formula():
    h, w = 3, 4
    rope = FrameRope(D)
    cos, sin = rope.tables(h, w, torch.device('cpu'), torch.float64)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6 + h * w, D, dtype=torch.float64, generator=g)
    out = rotate_half_2d(q, cos, sin)
    for n in range(6 + h * w):
        row, col = (0, 0) if n < 6 else ((n - 6) // w + 1, (n - 6) % w + 1)
        want = torch.tensor(_frame_rope_reference(q[1, n].tolist(), row, col), dtype=torch.float64)
        torch.testing.assert_close(out[1, n], want, rtol=0, atol=1e-12)
    # special tokens sit at (0, 0): unrotated
    torch.testing.assert_close(out[:, :6], q[:, :6], rtol=0, atol=0)


def test_video_rope_matches_formula_over_frames():
    h, w, t0, frames = 2, 3, 5, 2
    rope = VideoRope(D, max_frames=16)
    cos, sin = rope.tables(t0, frames, h, w, torch.device('cpu'), torch.float64)
    p = 6 + h * w
    assert cos.shape == (frames * p, D // 2)
    q = torch.randn(1, 2, frames * p, D, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1))
    out = rotate_interleaved(q, cos, sin)
    for f in range(frames):
        for n in range(p):
            row, col = (n, n) if n < 6 else (6 + (n - 6) // w, 6 + (n - 6) % w)
            x = q[0, 1, f * p + n].tolist()
            want = torch.tensor(_video_rope_reference(x, t0 + f, row, col), dtype=torch.float64)
            torch.testing.assert_close(out[0, 1, f * p + n], want, rtol=0, atol=1e-12)


def test_video_rope_scores_depend_on_time_offset_only():
    # <R(t1) q, R(t2) k> is invariant under shifting both times by the same amount
    rope = VideoRope(D, max_frames=64)
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 1, 12, D, generator=g, dtype=torch.float64).unbind(2)[:2]

    def score(tq: int, tk: int) -> torch.Tensor:
        cq, sq = rope.tables(tq, 1, 1, 1, torch.device('cpu'), torch.float64)
        ck, sk = rope.tables(tk, 1, 1, 1, torch.device('cpu'), torch.float64)
        return (rotate_interleaved(q[:, None], cq[:1], sq[:1])
                * rotate_interleaved(k[:, None], ck[:1], sk[:1])).sum()

    torch.testing.assert_close(score(3, 10), score(40, 47), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(score(3, 10), score(3, 11))


def test_tables_built_once_and_float32_rounded_from_float64(monkeypatch):
    calls = []

    def counting_frequencies(width, base):
        calls.append(width)
        return frequencies(width, base)

    frequencies = rope_module.axis_frequencies
    monkeypatch.setattr(rope_module, 'axis_frequencies', counting_frequencies)
    rope, frame = VideoRope(D, max_frames=8), FrameRope(D)
    first = rope.tables(0, 1, 2, 2, torch.device('cpu'), torch.float32)
    frame_first = frame.tables(2, 2, torch.device('cpu'), torch.float32)
    built = len(calls)
    for t in range(1, 8):
        rope.tables(t, 1, 2, 2, torch.device('cpu'), torch.float32)
        assert frame.tables(2, 2, torch.device('cpu'), torch.float32) is frame_first
    assert len(calls) == built  # later calls only slice the cached tables
    wide = rope.tables(0, 1, 2, 2, torch.device('cpu'), torch.float64)
    # Exact: both tables are computed in float64 and only cast, so the cast commutes.
    assert torch.equal(first[0], wide[0].float())
    assert torch.equal(first[1], wide[1].float())


def test_video_rope_rejects_time_past_table():
    rope = VideoRope(D, max_frames=8)
    rope.tables(7, 1, 1, 1, torch.device('cpu'), torch.float32)
    with pytest.raises(ValueError, match='outside'):
        rope.tables(7, 2, 1, 1, torch.device('cpu'), torch.float32)
