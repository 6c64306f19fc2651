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
"""The 8-bit attention emulation (``bench/quant_emulation.py``) against float64 references.

The gate table of issue #44 is worth reading only if the emulation rounds what it says and
nothing else: its pieces (INT8 levels, e4m3, the cut accumulator, the Hadamard) are checked
on known values, and whole designs against a plain block-by-block float64 loop that applies
the same roundings. CPU only, small tensors.

Run: ``python -m pytest test/bench/test_quant_emulation.py``.
"""

import math
from pathlib import Path
import sys

import pytest
import torch

# The bench scripts import each other by name, from their folder (as ``python3 bench/x.py`` does).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'bench'))
from quant_emulation import cut_fraction, emulated_attention, EmulatedBackend, hadamard, \
    quantize_int8, Recipe, RECIPES, to_e4m3  # noqa: E402,I100

EXACT = Recipe(qk='exact', key_mean=False, p_format='exact', v_format='exact')


def _inputs(nq=20, nk=300, heads=2, dim=16, seed=0, key_offset=0.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(nq, heads, dim, generator=gen) * 2.0
    k = torch.randn(nk, heads, dim, generator=gen) + key_offset
    v = torch.randn(nk, heads, dim, generator=gen)
    return q, k, v


def _softmax64(q, k, v):
    """Plain attention in float64: [Q, H, D]."""
    q64, k64, v64 = (t.double().transpose(0, 1) for t in (q, k, v))
    s = q64 @ k64.transpose(1, 2) / math.sqrt(q.shape[-1])
    return (torch.softmax(s, -1) @ v64).transpose(0, 1)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_e4m3_rounds_to_three_fraction_bits_and_saturates():
    x = torch.tensor([1.0625, 1.1875, 500.0, -500.0, 0.3, 2.0 ** -9])
    got = to_e4m3(x)
    # 1.0625 is half-way between 1 and 1.125: to even (1.0); 1.1875 -> 1.25 (even neighbour).
    expected = torch.tensor([1.0, 1.25, 448.0, -448.0, 0.3125, 2.0 ** -9])
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)


def test_cut_fraction_drops_low_bits_toward_zero():
    x = torch.tensor([1.0 + 2.0 ** -20, -(1.0 + 2.0 ** -20), 1.5 + 2.0 ** -14, 3.0])
    got = cut_fraction(x, 13)
    assert torch.allclose(got, torch.tensor([1.0, -1.0, 1.5, 3.0]), rtol=0, atol=0)
    assert torch.equal(cut_fraction(x, 23), x)
    with pytest.raises(ValueError):
        cut_fraction(x, 24)


def test_int8_levels_scales_and_error_per_group():
    x = torch.randn(3, 40, 8, generator=torch.Generator().manual_seed(1)) * 5
    levels, scales = quantize_int8(x, 16, -2)
    assert levels.shape == x.shape and scales.shape == (3, 40, 1)
    assert torch.equal(levels, levels.round()) and float(levels.abs().max()) <= 127.0
    # One scale per 16 rows (the last group has 8): amax / 127, and the group's max is +-127.
    for g0 in (0, 16, 32):
        group = x[:, g0:g0 + 16]
        amax = group.abs().amax(dim=(1, 2))
        assert torch.allclose(scales[:, g0:g0 + 16, 0], (amax / 127)[:, None].expand(
            -1, group.shape[1]), rtol=1e-6)
        assert torch.allclose(levels[:, g0:g0 + 16].abs().amax(dim=(1, 2)),
                              torch.full((3,), 127.0))
    assert float(((levels * scales - x).abs() - scales / 2).max()) <= 1e-5


def test_hadamard_is_orthonormal_with_signs():
    h = hadamard(64, seed=3).double()
    assert torch.allclose(h @ h.T, torch.eye(64, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(h.abs(), torch.full((64, 64), 1 / 8.0, dtype=torch.float64))
    with pytest.raises(ValueError):
        hadamard(48)


def test_no_rounding_is_plain_attention():
    q, k, v = _inputs()
    assert _rel(emulated_attention(q, k, v, EXACT), _softmax64(q, k, v)) < 1e-5


def test_key_mean_and_hadamard_change_nothing_without_rounding():
    # Shifted keys (a large common offset) and the rotation are exact transforms of softmax.
    q, k, v = _inputs(key_offset=3.0)
    fixed_mean = torch.randn(2, 16, generator=torch.Generator().manual_seed(5))
    recipe = Recipe(qk='exact', key_mean=True, hadamard=True, p_format='exact',
                    v_format='exact')
    out = emulated_attention(q, k, v, recipe, key_mean=fixed_mean)
    assert _rel(out, _softmax64(q, k, v)) < 1e-5


def _design64(q, k, v, recipe, key_mean):
    """Compute the design block by block in float64 with the same roundings (the check)."""
    dim = q.shape[-1]
    out = torch.empty(q.shape, dtype=torch.float64)
    rot = hadamard(dim).double() if recipe.hadamard else torch.eye(dim, dtype=torch.float64)
    for h in range(q.shape[1]):
        qh = q[:, h].double() / math.sqrt(dim) @ rot
        kh = (k[:, h].double() - key_mean[h].double()) @ rot
        vh = v[:, h].double()
        qd = torch.cat([_int8_rows(qh[i:i + recipe.query_block])
                        for i in range(0, len(qh), recipe.query_block)])
        kd = torch.cat([_int8_rows(kh[i:i + recipe.key_block])
                        for i in range(0, len(kh), recipe.key_block)])
        vscale = vh.abs().amax(0) / 448.0
        vd = to_e4m3((vh / vscale).float()).double() * vscale
        m = torch.full((len(qh),), -math.inf, dtype=torch.float64)
        acc = torch.zeros(len(qh), dim, dtype=torch.float64)
        total = torch.zeros(len(qh), dtype=torch.float64)
        for b0 in range(0, len(kh), recipe.key_block):
            s = qd @ kd[b0:b0 + recipe.key_block].T
            new_m = torch.maximum(m, s.amax(1))
            alpha = torch.exp(m - new_m)
            p = torch.exp(s - new_m[:, None])
            total = total * alpha + p.sum(1)
            pq = to_e4m3((p * 448.0).float()).double() / 448.0
            acc = acc * alpha[:, None] + pq @ vd[b0:b0 + recipe.key_block]
            m = new_m
        out[:, h] = acc / total[:, None]
    return out


def _int8_rows(x):
    scale = x.abs().max() / 127.0
    return torch.round(x / scale).clamp(-127, 127) * scale


@pytest.mark.parametrize('name', ['a', 'b'])
def test_designs_match_a_block_by_block_float64_loop(name):
    q, k, v = _inputs(nq=40, nk=700, key_offset=1.5, seed=2)
    mean = k.mean(0)
    out = emulated_attention(q, k, v, RECIPES[name], key_mean=mean)
    ref = _design64(q, k, v, RECIPES[name], mean)
    # Equal up to float32 vs float64 arithmetic (a rare e4m3 tie of P may round apart).
    assert _rel(out, ref) < 2e-4
    # ...and the design's rounding is visible against exact attention.
    assert 1e-3 < _rel(out, _softmax64(q, k, v)) < 5e-2


def test_one_level_accumulation_cuts_the_sums():
    q, k, v = _inputs(nq=16, nk=1024, seed=4)
    base = {'qk': 'exact', 'key_mean': False, 'p_format': 'exact', 'v_format': 'exact'}
    exact = _softmax64(q, k, v)
    full = emulated_attention(q, k, v, Recipe(accumulation='one_level', acc_bits=23, **base))
    assert _rel(full, exact) < 1e-5
    coarse = emulated_attention(q, k, v, Recipe(accumulation='one_level', acc_bits=4, **base))
    err = _rel(coarse, exact)
    # Four kept fraction bits: up to 2^-4 of each partial sum lost over 8 blocks.
    assert 1e-3 < err < 0.2


def test_p_in_bf16_is_closer_than_p_in_e4m3():
    q, k, v = _inputs(nq=32, nk=2048, seed=6)
    base = {'qk': 'exact', 'key_mean': False, 'v_format': 'exact'}
    exact = _softmax64(q, k, v)
    e4m3 = _rel(emulated_attention(q, k, v, Recipe(p_format='e4m3', **base)), exact)
    bf16 = _rel(emulated_attention(q, k, v, Recipe(p_format='bf16', **base)), exact)
    # e4m3 keeps 3 fraction bits, bf16 7: about 16 times less rounding.
    assert bf16 < e4m3 / 4


def test_backend_fixes_the_key_mean_from_the_scale_pages():
    from lingbot_map_ros.engine.attention.page_layout import PageLayout
    torch.manual_seed(7)
    pages = 6
    k_pages = torch.randn(pages, 8, 2, 16)
    v_pages = torch.randn(pages, 8, 2, 16)
    q = torch.randn(5, 2, 16)
    layout = PageLayout.build((3, 4, 5, 0), 8, 5, 4, 2, 1, version=1)
    backend = EmulatedBackend(Recipe(qk='exact', key_mean=True, p_format='exact',
                                     v_format='exact'))
    out = backend.run(q, k_pages, v_pages, layout)
    k = torch.cat([k_pages[p] for p in (3, 4, 5, 0)])[:29]
    v = torch.cat([v_pages[p] for p in (3, 4, 5, 0)])[:29]
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel(out, _softmax64(q, k, v)) < 1e-5


def test_bad_recipe_and_shapes_are_refused():
    q, k, v = _inputs()
    with pytest.raises(ValueError):
        emulated_attention(q, k, v, Recipe(p_format='e5m2'))
    with pytest.raises(ValueError):
        emulated_attention(q, k[:, :1], v, EXACT)
