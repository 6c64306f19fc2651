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
"""The benchmark's Triton kernel variants (``bench/triton_fp8.py``) against float64.

The variants (split exponentials, FP8 products) run in the kernel tables only
(``bench/attention_kernels.py``), whose rows are worth reading only if the kernels are right:
this checks them. Runs where triton is installed: on CUDA, or on the CPU with
``TRITON_INTERPRET=1`` (fp16 there; numpy < 2.3; CI's interpreter run in ``scripts/test.sh``).
The interpreter rounds to e4m3 less accurately than the GPU's converter, so the FP8 bound is
looser than the benchmark's 8e-2. Skipped otherwise.

Run: ``python -m pytest test/bench/test_triton_fp8.py``.
"""

import os
from pathlib import Path
import sys

import pytest
import torch

triton = pytest.importorskip('triton')
ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get('TRITON_INTERPRET') != '1':
    pytest.skip('no CUDA and TRITON_INTERPRET is not 1', allow_module_level=True)

# The bench scripts import each other by name, from their folder (as ``python3 bench/x.py`` does).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'bench'))
from triton_fp8 import attend_run_fast  # noqa: E402,I100

DEV = 'cuda' if ON_GPU else 'cpu'
DTYPE = torch.bfloat16 if ON_GPU else torch.float16
FP8_BOUND = 8e-2 if ON_GPU else 1.5e-1


def _inputs(seed, n_q=40, n_k=300, heads=2, fp8_kv=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n_q, heads, 64, generator=gen).to(DEV, DTYPE)
    kv_dtype = torch.float8_e4m3fn if fp8_kv else DTYPE
    k, v = (torch.randn(n_k, heads, 64, generator=gen).to(DEV, kv_dtype) for _ in range(2))
    return q, k, v


def _error(out, q, k, v):
    q, k, v = q.double(), k.to(DTYPE).double(), v.to(DTYPE).double()
    s = torch.einsum('qhd,khd->hqk', q, k) / 8
    ref = torch.einsum('hqk,khd->qhd', s.softmax(-1), v)
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize('splits,start,stop', [(1, 0, 300), (3, 7, 290)])
def test_split_exponentials_match_float64(splits, start, stop):
    q, k, v = _inputs(splits)
    out = torch.full_like(q, float('nan'))
    bounds = torch.tensor([start, stop], dtype=torch.int32, device=DEV)
    attend_run_fast(q, k, v, bounds, splits=splits, block_m=32, block_n=64, exp_split=True,
                    out=out)
    assert not out.isnan().any()
    assert _error(out, q, k[start:stop], v[start:stop]) < 1e-2


@pytest.mark.parametrize('fp8_kv', [False, True])
def test_fp8_products_stay_within_the_fp8_bound(fp8_kv):
    q, k, v = _inputs(5, fp8_kv=fp8_kv)
    bounds = torch.tensor([0, 300], dtype=torch.int32, device=DEV)
    out = attend_run_fast(q, k, v, bounds, splits=2, block_m=32, block_n=64, fp8=True)
    assert not out.isnan().any()
    assert 1e-3 < _error(out, q, k, v) < FP8_BOUND  # e4m3 rounding shows, bounded


def test_refuses_bad_tiles_and_mixed_storage():
    q, k, v = _inputs(0)
    bounds = torch.tensor([0, 300], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match='block_n=48'):
        attend_run_fast(q, k, v, bounds, block_n=48)
    with pytest.raises(ValueError, match='both be FP8'):
        attend_run_fast(q, k.to(torch.float8_e4m3fn), v, bounds)
