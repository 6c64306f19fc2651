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
"""FP8 attention through backend ``fa3``: the per-head query cast and FA3 over a device run.

The query cast (``triton_quant.py``) runs where triton is installed: on CUDA, or on the CPU with
``TRITON_INTERPRET=1``. The FA3 tests need a Hopper GPU and the ``fa3-fwd`` package, and are
skipped without them.
"""

import math
import os

import pytest
import torch

pytest.importorskip('triton')
ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get('TRITON_INTERPRET') != '1':
    pytest.skip('no CUDA and TRITON_INTERPRET is not 1', allow_module_level=True)

from lingbot_map_ros.engine.attention.triton_quant import quantize_queries  # noqa: E402,I100

FP8 = torch.float8_e4m3fn
DEV = 'cuda' if ON_GPU else 'cpu'
# e4m3 keeps 3 mantissa bits (relative rounding <= 2^-4, ~2.6e-2 in L2 on the GPU); the
# interpreter rounds to e4m3 less accurately than the GPU's converter (test_triton_fp8.py).
CAST_BOUND = 4e-2 if ON_GPU else 1e-1


def test_query_cast_keeps_each_head_within_e4m3_rounding():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(333, 4, 64, generator=gen).to(DEV, torch.bfloat16)
    q[:, 1] *= 40.0          # heads of very different size get their own scale
    q[:, 2] = 0.0            # an all-zero head: no NaN, zeros stay zeros
    q8, descale = quantize_queries(q)
    assert q8.dtype == FP8 and descale.shape == (1, 4)
    back = q8.float() * descale[0][None, :, None]
    assert torch.isfinite(back).all()
    assert back[:, 2].abs().max().item() == pytest.approx(0.0, abs=1e-30)
    for h in (0, 1, 3):
        top = q[:, h].float().abs().max().item()
        assert descale[0, h].item() == pytest.approx(top / 448.0, rel=1e-6)
        err = ((back[:, h] - q[:, h].float()).norm() / q[:, h].float().norm()).item()
        assert err < CAST_BOUND


def test_head_scales_of_parts_map_each_runs_head_to_e4m3s_top():
    from lingbot_map_ros.engine.attention.fa3 import head_scaled_queries
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 50, 3, 64, generator=gen).to(DEV, torch.bfloat16)
    q[1, :, 0] *= 30.0   # run 1's head 0 is larger: its own scale
    q[0, :, 2] = 0.0     # an all-zero head: scale 1, zeros stay zeros
    scaled, descale = head_scaled_queries(q, 4)
    assert scaled.dtype == torch.float32 and descale.shape == (8, 3)
    for run in range(2):
        for h in range(3):
            top = q[run, :, h].float().abs().max().item()
            want = top / 448.0 if top > 0 else 1.0
            # Every part of the run carries the run's descale.
            got = descale[run * 4:run * 4 + 4, h].tolist()
            assert got == pytest.approx([want] * 4, rel=1e-6)
            if top > 0:
                assert scaled[run, :, h].abs().max().item() == pytest.approx(448.0, rel=1e-5)
    back = scaled * descale[::4][:, None, :, None]
    assert torch.allclose(back, q.float(), rtol=1e-5, atol=1e-30)
    one, one_descale = head_scaled_queries(q[0], 2)
    assert one.shape == q[0].shape and one_descale.shape == (2, 3)


def _fa3(parts=None, joint_tail_rows=0, query_scale=None):
    if not ON_GPU or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip('FA3 needs a Hopper GPU')
    pytest.importorskip('fa3_fwd_interface')
    from lingbot_map_ros.engine.attention.fa3 import Fa3RunAttention
    return Fa3RunAttention(parts=parts, joint_tail_rows=joint_tail_rows,
                           query_scale=query_scale)


def _reference(q, k, v):
    q, k, v = (t.double() for t in (q, k, v))
    s = torch.einsum('qhd,khd->hqk', q, k) / math.sqrt(q.shape[-1])
    return torch.einsum('hqk,khd->qhd', s.softmax(-1), v)


@pytest.mark.gpu
@pytest.mark.parametrize('parts,query_scale', [(1, 'unit'), (4, 'unit'), (32, 'head')])
@pytest.mark.parametrize('fp8,bound', [(False, 2e-2), (True, 8e-2)])
def test_fa3_attends_to_the_device_run_only(fp8, bound, parts, query_scale):
    # A lone run keeps its last 8 rows (200 = 192 + 8) on FA3 whatever joint_tail_rows says.
    attend = _fa3(parts, 64, query_scale)
    gen = torch.Generator(device='cuda').manual_seed(5)
    q, k, v = (torch.randn(n, 4, 64, device='cuda', generator=gen).to(torch.bfloat16)
               for n in (200, 3000, 3000))
    k[:500] = 1e3  # outside the run: any read of it would wreck the output
    if fp8:
        k, v = k.to(FP8), v.to(FP8)
    bounds = torch.tensor([500, 2700], dtype=torch.int32, device='cuda')
    out = attend(q, k, v, bounds)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    ref = _reference(q, k[500:2700].to(torch.bfloat16), v[500:2700].to(torch.bfloat16))
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < bound


@pytest.mark.gpu
@pytest.mark.parametrize('parts', [1, 4])
def test_fa3_in_a_cuda_graph_follows_bounds_moved_between_replays(parts):
    attend = _fa3(parts)
    gen = torch.Generator(device='cuda').manual_seed(6)
    q = torch.randn(300, 4, 64, device='cuda', generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(5000, 4, 64, device='cuda', generator=gen).to(FP8) for _ in range(2))
    bounds = torch.tensor([0, 5000], dtype=torch.int32, device='cuda')
    attend(q, k, v, bounds)  # warm: FA3's and our kernels compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attend(q, k, v, bounds)
    for lo, hi in ((0, 5000), (1234, 4321), (4000, 4999)):
        bounds.copy_(torch.tensor([lo, hi], dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        ref = _reference(q, k[lo:hi].to(torch.bfloat16), v[lo:hi].to(torch.bfloat16))
        assert ((out.double() - ref).norm() / ref.norm()).item() < 8e-2


@pytest.mark.gpu
@pytest.mark.parametrize('tail_rows', [0, 64])
@pytest.mark.parametrize('fp8,bound', [(False, 2e-2), (True, 8e-2)])
def test_fa3_attends_several_runs_in_one_launch_each_over_its_own_keys(fp8, bound, tail_rows):
    # A batch of streams: run b's queries over its own range of the one pool, the ranges in
    # any order, of different lengths, one of them in the middle of another stream's pages.
    # 200 queries a run: with joint_tail_rows 64 each run's last 8 go to our kernel.
    attend = _fa3(4, tail_rows).attend_runs
    gen = torch.Generator(device='cuda').manual_seed(7)
    q = torch.randn(3, 200, 4, 64, device='cuda', generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(9000, 4, 64, device='cuda', generator=gen).to(torch.bfloat16)
            for _ in range(2))
    runs = [(6000, 8900), (100, 1100), (3000, 3333)]
    k[1100:3000] = 1e3  # in no run: any read of it would wreck the outputs
    if fp8:
        k, v = k.to(FP8), v.to(FP8)
    bounds = torch.tensor([[a, b, 0, 0] for a, b in runs], dtype=torch.int32, device='cuda')
    out = attend(q, k, v, bounds)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    for b, (lo, hi) in enumerate(runs):
        ref = _reference(q[b], k[lo:hi].to(torch.bfloat16), v[lo:hi].to(torch.bfloat16))
        assert ((out[b].double() - ref).norm() / ref.norm()).item() < bound
