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
"""Variants of our Triton cache-attention kernel: FP8 matrix products, split exponentials.

Shapes as ``triton_attention.py``: ``q [Q, H, D]``, keys and values as token views ``[N, H, D]``
of a layer's pool, the visible run ``[start, stop)`` read from the device tensor ``bounds``; the
key run is split into ``splits`` parts merged by log-sum-exp (that module's merge kernel).

Why: at head dim 64 the bf16 kernel is bound by the softmax exponentials, not the tensor cores
(docs/performance.md: ~2.7e10 exponentials per frame on units that do ~4.2e12/s). Two levers:

* ``fp8``: QK and PV on Hopper's FP8 tensor cores (e4m3, twice the bf16 rate), with per-block
  scales so that e4m3's range is used: per query row for Q (its max |q| maps to 448), per key
  for K, per channel of each key tile for V, and P (in [0, 1]) times 256, so that weights down to
  2^-17 of the row's largest survive. An FP8 pool (``cache.dtype: float8_e4m3fn``, unit
  scale) is read as it is, with no K/V scales.
* ``exp_split``: FlashAttention-4's trick for the exponential bottleneck: each key tile is two
  halves; one half's ``exp2`` runs on the special-function unit (MUFU), the other's as a
  Cody-Waite range reduction plus a degree-3 polynomial on the FMA units (relative error 1.9e-4,
  far under bf16's rounding of P), so the two units work in parallel.

Both are kernels to measure (``attention_kernels.py``, through ``triton_runs.py``): measured
slower than the engine's kernel (docs/performance.md), so they live here, outside the package;
no backend runs them and no ``cache.kernel`` knob selects them (``kernel_json.py`` refuses
their keys). Their check: ``test/bench/test_triton_fp8.py``.
"""

from __future__ import annotations

import math

from lingbot_map_ros.engine.attention.triton_attention import check_run_operands, LOG2E
from lingbot_map_ros.engine.attention.triton_attention import merge_parts
import torch
import triton
import triton.language as tl

E4M3_MAX = 448.0
P_SCALE = 256.0
"""P in [0, 1] is stored as P * 256 in e4m3 (exact power of two; undone after the product)."""


@triton.jit
def _exp2_poly(x):
    """2^x for x <= 0 on the FMA units: 2^round(x) by exponent bits, 2^frac by a cubic."""
    x = tl.maximum(x, -126.0)
    t = x + 12582912.0  # 1.5 * 2^23: the integer part lands in the mantissa, rounded
    j = t - 12582912.0
    f = x - j  # in [-0.5, 0.5]
    p = 0.05587554 * f + 0.24229463
    p = p * f + 0.69312726
    p = p * f + 0.99994823
    bits = p.to(tl.int32, bitcast=True) + \
        ((t.to(tl.int32, bitcast=True) - 0x4B400000) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _scores(q, qs, k_ptrs, key_ok, FP8: tl.constexpr, SCALE_KV: tl.constexpr):
    """Scores of one key (half-)tile ``k: [D, N]`` against ``q``, before the softmax scale."""
    if key_ok is None:
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=key_ok[None, :], other=0.0)
    if FP8:
        if SCALE_KV:
            kf = k.to(tl.float32)
            ks = tl.maximum(tl.max(tl.abs(kf), 0), 1e-12) / 448.0
            k8 = (kf / ks[None, :]).to(tl.float8e4nv)
            qk = tl.dot(q, k8) * (qs[:, None] * ks[None, :])
        else:
            qk = tl.dot(q, k.to(tl.float8e4nv)) * qs[:, None]
    else:
        qk = tl.dot(q, k.to(q.dtype))
    if key_ok is not None:
        qk = tl.where(key_ok[None, :], qk, float('-inf'))
    return qk


@triton.jit
def _pv(p, v_ptrs, key_ok, out_dtype: tl.constexpr, FP8: tl.constexpr,
        SCALE_KV: tl.constexpr):
    """``p @ v`` of one key (half-)tile ``v: [N, D]``, in float32."""
    if key_ok is None:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=key_ok[:, None], other=0.0)
    if FP8:
        p8 = (p * 256.0).to(tl.float8e4nv)
        if SCALE_KV:
            vf = v.to(tl.float32)
            vs = tl.maximum(tl.max(tl.abs(vf), 0), 1e-12) / 448.0
            v8 = (vf / vs[None, :]).to(tl.float8e4nv)
            return tl.dot(p8, v8) * (vs / 256.0)[None, :]
        return tl.dot(p8, v.to(tl.float8e4nv)) * (1.0 / 256.0)
    return tl.dot(p.to(out_dtype), v.to(out_dtype))


@triton.jit
def _tile(q, qs, k_base, v_base, s_km, s_vm, n0, hi, m_i, l_i, acc, qk_scale, offs_h,
          out_dtype: tl.constexpr, MASKED: tl.constexpr, FP8: tl.constexpr, SCALE_KV: tl.constexpr,
          EXP_SPLIT: tl.constexpr, HALF: tl.constexpr):
    """Online-softmax update with the key tile ``[n0, n0 + 2 * HALF)`` (log2 domain)."""
    keys_a = n0 + offs_h
    keys_b = n0 + HALF + offs_h
    if MASKED:
        ok_a = keys_a < hi
        ok_b = keys_b < hi
    else:
        ok_a = None
        ok_b = None
    qk_a = _scores(q, qs, k_base + keys_a[None, :] * s_km, ok_a, FP8, SCALE_KV)
    qk_b = _scores(q, qs, k_base + keys_b[None, :] * s_km, ok_b, FP8, SCALE_KV)
    m_new = tl.maximum(m_i, tl.maximum(tl.max(qk_a, 1), tl.max(qk_b, 1)) * qk_scale)
    shift = tl.where(m_new == float('-inf'), 0.0, m_new)
    p_a = tl.math.exp2(qk_a * qk_scale - shift[:, None])
    if EXP_SPLIT:
        p_b = _exp2_poly(qk_b * qk_scale - shift[:, None])
    else:
        p_b = tl.math.exp2(qk_b * qk_scale - shift[:, None])
    alpha = tl.math.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p_a, 1) + tl.sum(p_b, 1)
    acc = acc * alpha[:, None]
    acc += _pv(p_a, v_base + keys_a[:, None] * s_vm, ok_a, out_dtype, FP8, SCALE_KV)
    acc += _pv(p_b, v_base + keys_b[:, None] * s_vm, ok_b, out_dtype, FP8, SCALE_KV)
    return m_new, l_i, acc


@triton.jit
def _attend_part_fast(Q, K, V, Out, M, bounds, n_q, qk_scale,
                      s_qm, s_qh, s_km, s_kh, s_vm, s_vh, s_op, s_om, s_oh, s_mp, s_mh,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      SPLITS: tl.constexpr, FP8: tl.constexpr, SCALE_KV: tl.constexpr,
                      EXP_SPLIT: tl.constexpr):
    """One (query tile, head, key part): unnormalised partial output and its log2 max/sum."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    part = tl.program_id(2)
    start = tl.load(bounds)
    stop = tl.load(bounds + 1)
    per_part = tl.cdiv(tl.cdiv(stop - start, SPLITS), BLOCK_N) * BLOCK_N
    lo = start + part * per_part
    hi = tl.minimum(lo + per_part, stop)
    HALF: tl.constexpr = BLOCK_N // 2
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_h = tl.arange(0, HALF)
    row_ok = offs_m < n_q
    q = tl.load(Q + offs_m[:, None] * s_qm + head * s_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    qs = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    if FP8:
        qf = q.to(tl.float32)
        qs = tl.maximum(tl.max(tl.abs(qf), 1), 1e-12) / 448.0
        q = (qf / qs[:, None]).to(tl.float8e4nv)
    out_dtype: tl.constexpr = Q.dtype.element_ty
    m_i = tl.full([BLOCK_M], float('-inf'), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k_base = K + head * s_kh + offs_d[:, None]
    v_base = V + head * s_vh + offs_d[None, :]
    full_end = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N
    for n0 in range(lo, full_end, BLOCK_N):
        m_i, l_i, acc = _tile(q, qs, k_base, v_base, s_km, s_vm, n0, hi, m_i, l_i, acc,
                              qk_scale, offs_h, out_dtype, False, FP8, SCALE_KV, EXP_SPLIT,
                              HALF)
    if full_end < hi:
        m_i, l_i, acc = _tile(q, qs, k_base, v_base, s_km, s_vm, full_end, hi, m_i, l_i, acc,
                              qk_scale, offs_h, out_dtype, True, FP8, SCALE_KV, EXP_SPLIT,
                              HALF)
    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_ptrs = Out + part * s_op + offs_m[:, None] * s_om + head * s_oh + offs_d[None, :]
    tl.store(o_ptrs, acc, mask=row_ok[:, None])
    tl.store(M + part * s_mp + head * s_mh + offs_m, m_i + tl.log2(l_i), mask=row_ok)


def attend_run_fast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor, *,
                    splits: int = 2, block_m: int = 128, block_n: int = 128, num_warps: int = 8,
                    num_stages: int = 2, fp8: bool = False, exp_split: bool = False,
                    out: torch.Tensor | None = None,
                    scratch: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``attend_run`` (``triton_attention.py``) with FP8 products and/or split exponentials.

    Args:
        q, k, v, bounds, splits, block_m, num_warps, num_stages, out, scratch: as
            ``attend_run`` (``splits`` >= 1; the parts are always merged).
        block_n: Key tile, two halves of ``block_n // 2`` (>= 32).
        fp8: QK and PV in e4m3 with per-block scales (an FP8 pool: unit K/V scales).
        exp_split: one half of each tile's exponentials by polynomial on the FMA units.

    Returns:
        ``[Q, H, D]`` in the dtype of ``q``.

    Raises:
        ValueError: shapes, dtypes or sizes the kernel does not take.
    """
    num_q, heads, dim = q.shape
    check_run_operands(q, k, v, bounds, splits)
    if block_n < 32 or block_n & (block_n - 1):
        raise ValueError(f'triton fast attention: block_n={block_n} must be a power of 2 >= 32')
    if (k.dtype == torch.float8_e4m3fn) != (v.dtype == torch.float8_e4m3fn):
        raise ValueError('triton fast attention: k and v must both be FP8 or neither')
    if out is None:
        out = torch.empty_like(q)
    if scratch is None:
        scratch = (torch.empty(splits, num_q, heads, dim, dtype=torch.float32, device=q.device),
                   torch.empty(splits, heads, num_q, dtype=torch.float32, device=q.device))
    parts, lse = scratch
    grid = (triton.cdiv(num_q, block_m), heads, splits)
    _attend_part_fast[grid](
        q, k, v, parts, lse, bounds, num_q, LOG2E / math.sqrt(dim),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        parts.stride(0), parts.stride(1), parts.stride(2), lse.stride(0), lse.stride(1),
        HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n, SPLITS=splits, FP8=fp8,
        SCALE_KV=k.dtype != torch.float8_e4m3fn, EXP_SPLIT=exp_split,
        num_warps=num_warps, num_stages=num_stages)
    merge_m = 64
    merge_parts[(triton.cdiv(num_q, merge_m), heads)](
        parts, lse, out, num_q, parts.stride(0), parts.stride(1), parts.stride(2),
        lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=dim, BLOCK_M=merge_m, SPLITS=splits, num_warps=4)
    return out
