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
