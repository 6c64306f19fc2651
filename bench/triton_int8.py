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
"""Issue #44's design (a) as a Triton kernel: INT8 Q.K, FP8 P.V, FP32 sums per key block.

A study kernel (the package does not use it yet): it reads what a cache built for it would
store, and is timed here against the default kernel at our shape before any cache is changed.

* keys: INT8 levels ``[N, H, D]`` after the stream's key mean, one float32 scale per 128 keys
  and head (``k_scale [H, N / 128]``);
* values: e4m3, transposed (``vt [H, D, N]``, keys contiguous: the K-major operand that
  Hopper's FP8 products need), one float32 scale per channel and head (``v_scale [H, D]``);
* queries: INT8 levels with one scale per 16 rows and head, made per frame (``quantize``).

Per key block the scores are one INT8 product (exact int32 sums), scaled by the row's and
the block's scales; P = exp2(s - running max) in [0, 1] goes to e4m3 at 448 for one FP8
product with a fresh float32 accumulator, added to the running output in float32 (the
promotion per block of bench/quant_emulation.py's 'two_level'). The row sums use P in float32.
The channel scales of V and 1/448 are applied once at the end. Key parts as the default
kernel (``triton_attention.py``), merged by its ``merge_parts``.

Run on the GPU machine from the repository root: ``python3 bench/triton_int8.py [--json-out
F]``: checks the kernel against the float32 emulation of design (a) and float64 attention on
random inputs, then times it and the default kernel at 978 queries x 72,984 keys x 16 x 64.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import triton
import triton.language as tl

from quant_emulation import E4M3_MAX, quantize_int8  # noqa: I100

LOG2E = 1.4426950408889634
KEY_BLOCK = 128


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             key_mean: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Return the kernel's operands for ``q: [Q, H, D]``, ``k, v: [N, H, D]`` (design a).

    The softmax factor ``log2(e) / sqrt(D)`` is folded into the query scales.
    """
    dim = q.shape[-1]
    qh = q.transpose(0, 1).float()
    kh = k.transpose(0, 1).float()
    vh = v.transpose(0, 1).float()
    mean = kh.mean(1) if key_mean is None else key_mean.float()
    ql, qs = quantize_int8(qh, 16, -2)
    kl, ks = quantize_int8(kh - mean[:, None, :], KEY_BLOCK, -2)
    amax = vh.abs().amax(1)
    vscale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    vt = (vh / vscale[:, None, :]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return {'q': ql.to(torch.int8).transpose(0, 1).contiguous(),
            'q_scale': (qs[..., 0] * (LOG2E / math.sqrt(dim))).contiguous(),  # [H, Q]
            'k': kl.to(torch.int8).transpose(0, 1).contiguous(),
            'k_scale': ks[:, ::KEY_BLOCK, 0].contiguous(),  # [H, N / 128]
            'vt': vt.transpose(1, 2).contiguous(),  # [H, D, N]
            'v_scale': vscale.contiguous()}  # [H, D]


@triton.jit
def _int8_part(Q, QS, K, KS, VT, VS, Out, M, bounds, n_q,
               s_qm, s_qh, s_qsh, s_km, s_kh, s_ksh, s_vh, s_vd, s_vsh, s_op, s_om, s_oh,
               s_mp, s_mh, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, IMPRECISE: tl.constexpr):
    """One (query tile, head, key part): normalised partial output and its log2-sum-exp."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    part = tl.program_id(2)
    start = tl.load(bounds)
    stop = tl.load(bounds + 1)
    per_part = tl.cdiv(tl.cdiv(stop - start, SPLITS), BLOCK_N) * BLOCK_N
    lo = start + part * per_part
    hi = tl.minimum(lo + per_part, stop)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = offs_m < n_q
    q = tl.load(Q + offs_m[:, None] * s_qm + head * s_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0)
    q_scale = tl.load(QS + head * s_qsh + offs_m, mask=row_ok, other=0.0)
    m_i = tl.full([BLOCK_M], float('-inf'), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        keys = n0 + offs_n
        key_ok = keys < hi
        k = tl.load(K + keys[None, :] * s_km + head * s_kh + offs_d[:, None],
                    mask=key_ok[None, :], other=0)
        # [D, N] from V transposed: keys contiguous (the K-major FP8 operand).
        vt = tl.load(VT + head * s_vh + offs_d[:, None] * s_vd + keys[None, :],
                     mask=key_ok[None, :], other=0.0)
        k_scale = tl.load(KS + head * s_ksh + n0 // 128)  # the pool's 128-key blocks
        s = tl.dot(q, k).to(tl.float32) * (q_scale[:, None] * k_scale)
        s = tl.where(key_ok[None, :], s, float('-inf'))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float('-inf'), 0.0, m_new)
        p = tl.math.exp2(s - shift[:, None])
        alpha = tl.math.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        p8 = (p * 448.0).to(tl.float8e4nv)
        # A fresh float32 accumulator per block, added in float32: the promotion.
        if IMPRECISE > 0:  # promote inside the block too, every IMPRECISE products
            pv = tl.dot(p8, tl.trans(vt), max_num_imprecise_acc=IMPRECISE)
        else:
            pv = tl.dot(p8, tl.trans(vt))
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    v_scale = tl.load(VS + head * s_vsh + offs_d)
    out = acc * v_scale[None, :] / (448.0 * tl.where(l_i > 0.0, l_i, 1.0))[:, None]
    tl.store(Out + part * s_op + offs_m[:, None] * s_om + head * s_oh + offs_d[None, :], out,
             mask=row_ok[:, None])
    tl.store(M + part * s_mp + head * s_mh + offs_m, m_i + tl.log2(l_i), mask=row_ok)


def attend_int8(ops: dict[str, torch.Tensor], bounds: torch.Tensor, block_m: int = 128,
                block_n: int = 128, num_warps: int = 8, num_stages: int = 3,
                splits: int = 2, imprecise: int = 0) -> torch.Tensor:
    """Attend the operands of :func:`quantize` over keys ``[start, stop)``; ``[Q, H, D]`` bf16.

    ``start`` must be a multiple of 128 (the key scales' blocks); ``block_n`` divides 128.
    ``imprecise``: Triton's ``max_num_imprecise_acc`` for the FP8 P.V product (0: its
    default; the block's sum is promoted to float32 either way).
    """
    from lingbot_map_ros.engine.attention.triton_attention import merge_parts
    q = ops['q']
    num_q, heads, dim = q.shape
    parts = torch.empty(splits, num_q, heads, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(splits, heads, num_q, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(num_q, block_m), heads, splits)
    k, vt = ops['k'], ops['vt']
    _int8_part[grid](q, ops['q_scale'], k, ops['k_scale'], vt, ops['v_scale'], parts, lse,
                     bounds, num_q, q.stride(0), q.stride(1), ops['q_scale'].stride(0),
                     k.stride(0), k.stride(1), ops['k_scale'].stride(0), vt.stride(0),
                     vt.stride(1), ops['v_scale'].stride(0), parts.stride(0),
                     parts.stride(1), parts.stride(2), lse.stride(0), lse.stride(1),
                     HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n, SPLITS=splits,
                     IMPRECISE=imprecise, num_warps=num_warps, num_stages=num_stages)
    out = torch.empty(num_q, heads, dim, dtype=torch.bfloat16, device=q.device)
    merge_parts[(triton.cdiv(num_q, 64), heads)](
        parts, lse, out, num_q, parts.stride(0), parts.stride(1), parts.stride(2),
        lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), HEAD_DIM=dim, BLOCK_M=64,
        SPLITS=splits)
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main(argv: list[str]) -> int:
    """Check, then time the kernel and the default kernel at our shape; print a JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--json-out', default=None)
    args = parser.parse_args(argv)
    from quant_emulation import emulated_attention, RECIPES
    dev = 'cuda'
    gen = torch.Generator(device=dev).manual_seed(0)
    nq, nk, heads, dim = 978, 72_984, 16, 64
    q = torch.randn(nq, heads, dim, device=dev, generator=gen).to(torch.bfloat16)
    k = (torch.randn(nk, heads, dim, device=dev, generator=gen) + 0.5).to(torch.bfloat16)
    v = torch.randn(nk, heads, dim, device=dev, generator=gen).to(torch.bfloat16)
    ops = quantize(q, k, v)
    bounds = torch.tensor([0, nk], dtype=torch.int32, device=dev)
    result: dict = {'shape': [nq, nk, heads, dim], 'gpu': torch.cuda.get_device_name()}
    torch.backends.cuda.matmul.allow_tf32 = False
    check = slice(0, 8192)  # a shorter run for the float64 check (memory)
    mean = k.float().mean(0)
    out = attend_int8(quantize(q, k[check], v[check], mean),
                      torch.tensor([0, 8192], dtype=torch.int32, device=dev)).float()
    emu = emulated_attention(q, k[check], v[check], RECIPES['a'], key_mean=mean)
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k[check], v[check]))
    ref = (torch.softmax(qd @ kd.transpose(1, 2) / 8.0, -1) @ vd).transpose(0, 1)
    result['vs_emulation_a'] = _rel(out, emu)
    result['vs_float64'] = _rel(out, ref)
    result['emulation_vs_float64'] = _rel(emu, ref)
    configs = [{'block_m': bm, 'block_n': bn, 'num_warps': w, 'num_stages': s, 'splits': sp}
               for bm, bn, w, s, sp in ((128, 128, 8, 3, 2), (128, 64, 8, 3, 2),
                                        (128, 128, 8, 2, 2), (64, 128, 4, 3, 4),
                                        (128, 128, 4, 3, 2), (128, 64, 4, 3, 2),
                                        (128, 128, 8, 3, 1))]
    configs.append({**configs[0], 'imprecise': 32})
    promoted = attend_int8(quantize(q, k[check], v[check], mean),
                           torch.tensor([0, 8192], dtype=torch.int32, device=dev),
                           imprecise=32).float()
    result['promoted_32_vs_emulation_a'] = _rel(promoted, emu)
    times = []
    for cfg in configs:
        try:
            ms = triton.testing.do_bench(lambda: attend_int8(ops, bounds, **cfg),
                                         warmup=50, rep=300, return_mode='median')
        except Exception as exc:  # a config the compiler refuses: reported, not fatal
            times.append({**cfg, 'error': f'{type(exc).__name__}: {str(exc)[:200]}'})
            continue
        times.append({**cfg, 'ms': round(ms, 4)})
        print(json.dumps(times[-1]), flush=True)
    result['int8_fp8'] = times
    from lingbot_map_ros.engine.attention.triton_attention import attend_run
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    result['default_fp8_two_term_ms'] = round(triton.testing.do_bench(
        lambda: attend_run(q, k8, v8, bounds, block_m=128, block_n=64, num_warps=8,
                           num_stages=3, splits=2, qk_split=True),
        warmup=50, rep=300, return_mode='median'), 4)
    ok = [t['ms'] for t in times if 'ms' in t]
    result['int8_fp8_best_ms'] = min(ok) if ok else None
    print(json.dumps(result))
    if args.json_out:
        with open(args.json_out, 'w', encoding='utf-8') as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
