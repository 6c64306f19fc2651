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
"""The Triton cache-attention kernel against a float64 reference (GPU, or the CPU interpreter).

Runs where triton is installed: on CUDA, or on the CPU with ``TRITON_INTERPRET=1`` (whose
interpreter has no bf16 matrix product, so fp16 there; it also needs numpy < 2.3). Skipped
otherwise: triton is not a dependency of the package. The ``triton`` backend through the cache,
against the ``reference`` backend: test_attention_conformance.py.
"""

import os

import pytest
import torch

triton = pytest.importorskip('triton')
ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get('TRITON_INTERPRET') != '1':
    pytest.skip('no CUDA and TRITON_INTERPRET is not 1', allow_module_level=True)

from lingbot_map_ros.engine.attention.triton_attention import attend_run  # noqa: E402,I100

DEV = 'cuda' if ON_GPU else 'cpu'
DTYPE = torch.bfloat16 if ON_GPU else torch.float16
# FP8 products: e4m3's rounding (the benchmark's bound); the interpreter rounds to e4m3 less
# accurately than the GPU's converter (as in test_triton_fp8.py).
FP8_BOUND = 8e-2 if ON_GPU else 1.5e-1


def _reference(q, k, v):
    s = torch.einsum('qhd,khd->hqk', q.double(), k.double()) / q.shape[-1] ** 0.5
    return torch.einsum('hqk,khd->qhd', s.softmax(-1), v.double())


@pytest.mark.parametrize('splits,block_m,block_n,start,stop', [
    (1, 32, 32, 7, 290), (3, 32, 32, 0, 300), (8, 16, 32, 5, 100)])
def test_matches_float64_over_a_run_of_the_pool(splits, block_m, block_n, start, stop):
    gen = torch.Generator().manual_seed(splits)
    q = torch.randn(50, 4, 64, generator=gen).to(DEV, DTYPE)
    k, v = (torch.randn(300, 4, 64, generator=gen).to(DEV, DTYPE) for _ in range(2))
    out = torch.full_like(q, float('nan'))
    bounds = torch.tensor([start, stop], dtype=torch.int32, device=DEV)
    attend_run(q, k, v, bounds, splits=splits, block_m=block_m, block_n=block_n, out=out)
    ref = _reference(q, k[start:stop], v[start:stop])
    assert not out.isnan().any()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_fp8_keys_and_values_are_widened_in_registers():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(40, 2, 64, generator=gen).to(DEV, DTYPE)
    k, v = (torch.randn(200, 2, 64, generator=gen).to(DEV, torch.float8_e4m3fn)
            for _ in range(2))
    bounds = torch.tensor([0, 200], dtype=torch.int32, device=DEV)
    out = attend_run(q, k, v, bounds, splits=2, block_m=32, block_n=32, qk_fp8=False)
    ref = _reference(q, k.to(DTYPE), v.to(DTYPE))
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize('splits', [1, 3])
def test_fp8_kv_with_bf16_queries_runs_in_fp16_without_loss(splits):
    # bf16 queries (the model's) with FP8 K/V: both products in fp16 (the interpreter runs
    # fp16 products too). The reference uses the exact widened values in float64.
    gen = torch.Generator().manual_seed(splits)
    q = torch.randn(40, 2, 64, generator=gen).to(DEV, torch.bfloat16)
    k, v = (torch.randn(200, 2, 64, generator=gen).to(DEV, torch.float8_e4m3fn)
            for _ in range(2))
    bounds = torch.tensor([3, 197], dtype=torch.int32, device=DEV)
    out = attend_run(q, k, v, bounds, splits=splits, block_m=32, block_n=32, qk_fp8=False)
    ref = _reference(q, k[3:197].double(), v[3:197].double())
    assert out.dtype == torch.bfloat16
    # bf16 output rounding (2^-9) dominates: the widening itself is exact.
    assert ((out.double() - ref).norm() / ref.norm()).item() < 5e-3
    # A query value past fp16's range is clamped to 65504, never inf: no NaN in the output.
    q[0, 0, 0] = 1e6
    out = attend_run(q, k, v, bounds, splits=splits, block_m=32, block_n=32, qk_fp8=False)
    assert not out.isnan().any()
    ref = _reference(q.double().clamp(-65504, 65504), k[3:197].double(), v[3:197].double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 5e-3


@pytest.mark.parametrize('splits', [1, 2])
def test_fp8_keys_go_as_stored_into_an_fp8_qk_product_with_row_scaled_queries(splits):
    # The default for FP8 keys. Queries of 1e-3 (e4m3 subnormals at unit scale: most would
    # round to 0 or +-2^-9) next to rows of 0.1: each row gets its own scale, so every row keeps
    # e4m3's relative rounding (<= 2^-4 per value) and the output stays within the FP8 bound.
    gen = torch.Generator().manual_seed(10 + splits)
    q = torch.randn(40, 2, 64, generator=gen) * 0.1  # scores of std ~4 with these keys
    q[::2] *= 1e-2
    q = q.to(DEV, torch.bfloat16)
    k = (torch.randn(200, 2, 64, generator=gen) * 40).to(DEV, torch.float8_e4m3fn)
    v = torch.randn(200, 2, 64, generator=gen).to(DEV, torch.float8_e4m3fn)
    bounds = torch.tensor([5, 190], dtype=torch.int32, device=DEV)
    out = attend_run(q, k, v, bounds, splits=splits, block_m=32, block_n=32)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    k64, v64 = k[5:190].double(), v[5:190].double()
    ref = _reference(q, k64, v64)
    small = _reference(q[::2], k64, v64)
    err_small = ((out[::2].double() - small).norm() / small.norm()).item()
    assert ((out.double() - ref).norm() / ref.norm()).item() < FP8_BOUND
    assert err_small < FP8_BOUND
    # Unit-scale e4m3 queries lose the small rows: the row scale is what keeps them.
    unit = _reference(q.float().to(torch.float8_e4m3fn).double()[::2], k64, v64)
    assert ((unit - small).norm() / small.norm()).item() > 2 * err_small


def test_refuses_what_it_cannot_run():
    q = torch.zeros(4, 2, 48, dtype=DTYPE, device=DEV)
    bounds = torch.tensor([0, 4], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match='head dim 48'):
        attend_run(q, q, q, bounds)
    with pytest.raises(ValueError, match='bounds must be int32'):
        attend_run(q[..., :32], q[..., :32], q[..., :32], bounds.long())


@pytest.mark.parametrize('splits', [1, 2])
def test_split_queries_keep_bf16_precision_with_fp8_keys_as_stored(splits):
    # The faithful form (``qk_split``, the default): FP8 keys go as stored into two FP8
    # products with the queries' e4m3 term and 16 times its rounding residual. The result must
    # sit at the widened (exact-product) path's error, far under the one-term product's.
    gen = torch.Generator().manual_seed(20 + splits)
    q = (torch.randn(40, 2, 64, generator=gen) * 0.1).to(DEV, torch.bfloat16)
    k = (torch.randn(200, 2, 64, generator=gen) * 40).to(DEV, torch.float8_e4m3fn)
    v = torch.randn(200, 2, 64, generator=gen).to(DEV, torch.float8_e4m3fn)
    bounds = torch.tensor([2, 199], dtype=torch.int32, device=DEV)
    ref = _reference(q, k[2:199].double(), v[2:199].double())

    def error(**kwargs):
        out = attend_run(q, k, v, bounds, splits=splits, block_m=32, block_n=32, **kwargs)
        assert out.dtype == torch.bfloat16 and not out.isnan().any()
        return ((out.double() - ref).norm() / ref.norm()).item()

    split, single, wide = error(qk_fp8=True), error(qk_fp8=True, qk_split=False), \
        error(qk_fp8=False)
    assert split < 2 * wide + 2e-3
    assert single > 3 * split
