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
"""The key run in parts (``fa3_parts.py``): the parts' queries and key starts, and the merge.

Runs where triton runs: on CUDA, or on the CPU with ``TRITON_INTERPRET=1`` (skipped otherwise).
The merge is checked against attention over the whole run: each part's softmax attention and
natural-log sum-exp computed in float64, merged by the kernel, equal the attention over all
the keys.
"""

import math
import os

import pytest
import torch

pytest.importorskip('triton')
ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get('TRITON_INTERPRET') != '1':
    pytest.skip('no CUDA and TRITON_INTERPRET is not 1', allow_module_level=True)

from lingbot_map_ros.engine.attention.fa3_parts import (  # noqa: E402,I100
    merge_parts, prepare_parts)

DEV = 'cuda' if ON_GPU else 'cpu'
HALF = torch.bfloat16 if ON_GPU else torch.float16  # the interpreter has no bf16 loads
# e4m3 keeps 3 mantissa bits (~2.6e-2 in L2 on the GPU); the interpreter's converter is coarser.
CAST_BOUND = 4e-2 if ON_GPU else 1e-1


@pytest.mark.parametrize('parts', [1, 3, 4])
def test_parts_hold_the_queries_each_and_cut_the_run_evenly(parts):
    gen = torch.Generator().manual_seed(parts)
    q = (torch.randn(70, 2, 64, generator=gen) * 3).to(HALF).to(DEV)
    q[0, 0, 0] = 900.0  # beyond e4m3: saturates
    for dtype in (HALF, torch.float8_e4m3fn):
        q_parts = torch.full((parts * 70, 2, 64), 7.0, device=DEV).to(dtype)
        cu_k = torch.full((parts + 1,), -1, dtype=torch.int32, device=DEV)
        bounds = torch.tensor([1000, 1000 + 4097], dtype=torch.int32, device=DEV)
        prepare_parts(q, bounds, q_parts, cu_k)
        want = q.float() if dtype == HALF else q.float().clamp(-448, 448)
        for part in range(parts):
            got = q_parts[part * 70:(part + 1) * 70].float()
            assert got[0, 0, 0].item() == (900.0 if dtype == HALF else 448.0)
            if dtype == HALF:
                assert torch.equal(got, want)
            else:  # e4m3 rounding, as in test_fa3_fp8.py
                assert ((got - want).norm() / want.norm()).item() < CAST_BOUND
        assert cu_k.tolist() == [1000 + 4097 * i // parts for i in range(parts + 1)]


def attention_and_lse(q, k, v):
    """float64 softmax attention [Q, H, D] and its natural-log sum-exp [H, Q]."""
    s = torch.einsum('qhd,khd->hqk', q, k) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(s, dim=-1)
    return torch.einsum('hqk,khd->qhd', torch.softmax(s, dim=-1), v), lse


@pytest.mark.parametrize('parts', [1, 2, 4, 5])
def test_merged_parts_equal_attention_over_the_whole_run(parts):
    gen = torch.Generator().manual_seed(10 + parts)
    num_q, heads, dim, keys = 77, 3, 64, 401
    q, k, v = (torch.randn(n, heads, dim, generator=gen, dtype=torch.float64)
               for n in (num_q, keys, keys))
    k[:50] *= 4  # the parts' maxima differ by a lot
    want, _ = attention_and_lse(q, k, v)
    cuts = [keys * i // parts for i in range(parts + 1)]
    outs, lses = zip(*(attention_and_lse(q, k[a:b], v[a:b]) for a, b in zip(cuts, cuts[1:])))
    o = torch.cat(outs).to(HALF).to(DEV)
    lse = torch.cat(lses, dim=1).float().to(DEV)
    out = torch.full((num_q, heads, dim), float('nan'), device=DEV).to(HALF)
    got = merge_parts(o, lse, out).double().cpu()
    assert not torch.isnan(got).any()
    assert ((got - want).norm() / want.norm()).item() < 5e-3  # half-precision parts


@pytest.mark.parametrize('parts', [1, 4])
def test_runs_of_several_streams_get_their_own_parts_and_lengths(parts):
    # Three runs anywhere in the pool, the second before the first, one empty: each sequence
    # b * P + i holds run b's queries, starts at its part's first key, counts its part's keys.
    gen = torch.Generator().manual_seed(20 + parts)
    q = (torch.randn(3, 50, 2, 64, generator=gen) * 3).to(HALF).to(DEV)
    runs = [(9000, 9000 + 2049), (100, 100 + 777), (5000, 5000)]
    # Rows of 4 as the staged numbers are: start, stop in the first two.
    bounds = torch.tensor([[a, b, -7, -7] for a, b in runs], dtype=torch.int32, device=DEV)
    q_parts = torch.zeros(3 * parts * 50, 2, 64, device=DEV).to(HALF)
    cu_k = torch.full((3 * parts + 1,), -1, dtype=torch.int32, device=DEV)
    used = torch.full((3 * parts,), -1, dtype=torch.int32, device=DEV)
    prepare_parts(q, bounds, q_parts, cu_k, used)
    for b, (start, stop) in enumerate(runs):
        cuts = [start + (stop - start) * i // parts for i in range(parts + 1)]
        for i in range(parts):
            seq = b * parts + i
            assert torch.equal(q_parts[seq * 50:(seq + 1) * 50].cpu(), q[b].cpu())
            assert cu_k[seq].item() == cuts[i]
            assert used[seq].item() == cuts[i + 1] - cuts[i]
    assert cu_k[-1].item() == runs[-1][1]


def test_merge_of_several_runs_keeps_each_runs_parts_apart():
    gen = torch.Generator().manual_seed(31)
    runs, num_q, heads, dim = 3, 33, 2, 64  # two parts a run
    q = torch.randn(runs, num_q, heads, dim, generator=gen, dtype=torch.float64)
    kv = [(torch.randn(n, heads, dim, generator=gen, dtype=torch.float64) * (b + 1),
           torch.randn(n, heads, dim, generator=gen, dtype=torch.float64))
          for b, n in enumerate((90, 61, 140))]
    outs, lses, want = [], [], []
    for b, (k, v) in enumerate(kv):
        want.append(attention_and_lse(q[b], k, v)[0])
        cut = k.shape[0] // 3
        for a, z in ((0, cut), (cut, k.shape[0])):
            o, lse = attention_and_lse(q[b], k[a:z], v[a:z])
            outs.append(o)
            lses.append(lse)
    out = torch.full((runs, num_q, heads, dim), float('nan'), device=DEV).to(HALF)
    got = merge_parts(torch.cat(outs).to(HALF).to(DEV),
                      torch.cat(lses, dim=1).float().to(DEV), out).double().cpu()
    assert got.shape == (runs, num_q, heads, dim)
    for b in range(runs):
        assert ((got[b] - want[b]).norm() / want[b].norm()).item() < 5e-3


def test_a_part_without_keys_weighs_nothing():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(n, 2, 64, generator=gen, dtype=torch.float64) for n in (40, 90, 90))
    want, lse = attention_and_lse(q, k, v)
    o = torch.cat([want, torch.zeros_like(want)]).to(HALF).to(DEV)
    lses = torch.cat([lse, torch.full_like(lse, -math.inf)], dim=1).float().to(DEV)
    got = merge_parts(o, lses, torch.empty(40, 2, 64, device=DEV).to(HALF)).double().cpu()
    assert ((got - want).norm() / want.norm()).item() < 5e-3


def test_shapes_that_do_not_fit_are_refused():
    q = torch.zeros(10, 2, 64, device=DEV).to(HALF)
    with pytest.raises(ValueError, match='prepare_parts'):
        prepare_parts(q, torch.zeros(2, dtype=torch.int32, device=DEV),
                      torch.zeros(30, 2, 64, device=DEV).to(HALF),
                      torch.zeros(3, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match='merge_parts'):
        merge_parts(torch.zeros(20, 2, 64, device=DEV).to(HALF),
                    torch.zeros(2, 30, device=DEV), q)
    with pytest.raises(ValueError, match='several runs need used'):  # no lengths for 2 runs
        prepare_parts(torch.zeros(2, 10, 2, 64, device=DEV).to(HALF),
                      torch.zeros(2, 2, dtype=torch.int32, device=DEV),
                      torch.zeros(40, 2, 64, device=DEV).to(HALF),
                      torch.zeros(5, dtype=torch.int32, device=DEV))
