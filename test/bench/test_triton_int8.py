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
"""The INT8 Q.K / FP8 P.V study kernel (``bench/triton_int8.py``) against its emulation.

The kernel must compute design (a) of ``bench/quant_emulation.py`` (the same roundings) over
the device-side key run, split in parts. Runs where triton is installed: on CUDA, or on the
CPU with ``TRITON_INTERPRET=1`` (scripts/test.sh's interpreter run). Skipped otherwise.

Run: ``python -m pytest test/bench/test_triton_int8.py``.
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
from quant_emulation import emulated_attention, RECIPES  # noqa: E402,I100
from triton_int8 import attend_int8, quantize  # noqa: E402,I100

DEV = 'cuda' if ON_GPU else 'cpu'
# The interpreter's e4m3 cast is far rougher than the GPU's (up to half a value off, small
# values flushed: test_triton_fp8.py), so on the CPU the bounds only catch a wrong kernel.
EMU_BOUND, REF_BOUND = (1e-2, 5e-2) if ON_GPU else (0.15, 0.2)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize('splits', [1, 3])
def test_kernel_computes_design_a_over_the_device_run(splits):
    gen = torch.Generator().manual_seed(11)
    nq, nk, heads, dim = 40, 700, 2, 16
    q = torch.randn(nq, heads, dim, generator=gen).to(torch.bfloat16)
    k = (torch.randn(nk, heads, dim, generator=gen) + 1.0).to(torch.bfloat16)
    v = torch.randn(nk, heads, dim, generator=gen).to(torch.bfloat16)
    start, stop = 128, 600  # the run starts on a 128-key block, ends inside one
    mean = k[start:stop].float().mean(0)
    ops = quantize(*(t.to(DEV) for t in (q, k, v)), key_mean=mean.to(DEV))
    # Keys outside the run must not be read: wreck them after quantising.
    ops['k'][:start] = 127
    ops['vt'][..., :start] = 448.0
    bounds = torch.tensor([start, stop], dtype=torch.int32, device=DEV)
    out = attend_int8(ops, bounds, block_m=16, block_n=32, num_warps=4, num_stages=1,
                      splits=splits).float().cpu()
    assert out.shape == (nq, heads, dim) and torch.isfinite(out).all()
    # The kernel's V scales are over all keys: emulate with the same values.
    vt = ops['vt'].float().cpu() * ops['v_scale'].cpu()[:, :, None]
    v_rounded = vt.permute(2, 0, 1)[start:stop]
    recipe = RECIPES['a'].__class__(v_format='exact')
    emu = emulated_attention(q, k[start:stop], v_rounded, recipe, key_mean=mean)
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k[start:stop], v[start:stop]))
    ref = (torch.softmax(qd @ kd.transpose(1, 2) / dim ** 0.5, -1) @ vd).transpose(0, 1)
    # Same roundings: close to the emulation (bf16 output, exp2 for exp), and the design's
    # error against exact attention, not more.
    assert _rel(out, emu) < EMU_BOUND
    assert _rel(out, ref) < REF_BOUND
