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
"""A Triton attention kernel for the cache shape: one contiguous key run, split across CTAs.

Shapes: ``Q`` queries, ``H`` heads, ``D`` head dim (16, 32, 64 or 128), keys and values as
token views ``[N, H, D]`` of a layer's pool; the visible keys are the run ``[start, stop)``
read from a device tensor ``bounds`` (int32 ``[start, stop]``), so one CUDA graph serves every
frame whatever the run's place and length (no per-shape plan, unlike cuDNN).

Why its own kernel: at our shape (978 queries, ~73k keys, 16 x 64, bf16) a query tile per
(tile, head) gives only 8 x 16 = 128 CTAs on 132 SMs, one CTA per SM. Splitting the key run
into ``splits`` parts (FlashDecoding-style) gives ``splits`` times as many CTAs, so several
run per SM and hide each other's softmax behind their matrix products; a second, small kernel
merges the parts with their log-sum-exps. Other choices: ``exp2`` with ``log2(e) / sqrt(D)``
folded into one multiply-add per score; ``qk_fp8`` runs the QK product on the FP8 tensor
cores.

FP8 K and V (e4m3, unit scale: ``fp8.py``) are loaded as FP8 (half the bytes), with no
widened copy in memory. The keys go as they are into FP8 QK products (``qk_fp8``, the
default for FP8 keys), so K needs no conversion: a widened operand must be written back to
shared memory for Hopper's wgmma, a round trip that makes the widening kernel the slowest
form (docs/performance.md). The queries are scaled per row (the row's largest |q| at 448,
the scale folded into the row's softmax factor) and carried in two e4m3 terms, the rounded
value and its rounding residual (``qk_split``, the default): two FP8 products into one
accumulator, about bf16's query precision. One term (``qk_split=False``) halves the QK
products but rounds every query to 3 mantissa bits: on long real sequences that error
builds up across the cache to several times the official bf16 run's pose error, so it runs
only under ``cache.precision: fast_approximate`` (``backend_choice.py``). The values are
still widened in registers, to fp16
(``fp8.kernel_operand_dtype``), for the PV product: e4m3 is exact in fp16, the widening is
one instruction per two values (``cvt.rn.f16x2.e4m3x2``), and FP8 wgmma would need V
transposed (K-major). ``qk_fp8=False`` widens K too (exact products, the slower kernel).

The kernels run under ``TRITON_INTERPRET=1`` on the CPU (the tests' correctness check); the
package imports this module only where it is asked for (triton is not a hard dependency).
"""

from __future__ import annotations

import math

from lingbot_map_ros.engine.attention.backend_choice import fp8_products
from lingbot_map_ros.engine.attention.fp8 import kernel_operand_dtype
import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _attend_part(Q, K, V, Out, M, bounds, n_q, qk_scale,
                 s_qm, s_qh, s_km, s_kh, s_vm, s_vh, s_op, s_om, s_oh, s_mp, s_mh,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 SPLITS: tl.constexpr, QK_FP8: tl.constexpr, QK_SPLIT: tl.constexpr,
                 NORMALISE: tl.constexpr, MMA_FP16: tl.constexpr):
    """One (query tile, head, key part): unnormalised partial output and its log2 max/sum.

    ``MMA_FP16``: K and V are FP8 and both products run in fp16 (module docstring).
    ``QK_SPLIT`` (with ``QK_FP8``): the queries go in as two e4m3 terms (module docstring).
    """
    tile = tl.program_id(0)
    head = tl.program_id(1)
    part = tl.program_id(2)
    # int32 offsets: a layer's pool holds < 2^31 elements (85k tokens x 1,024 at our shape).
    start = tl.load(bounds)
    stop = tl.load(bounds + 1)
    # Parts are whole BLOCK_N tiles so that only the run's last tile needs a mask.
    per_part = tl.cdiv(tl.cdiv(stop - start, SPLITS), BLOCK_N) * BLOCK_N
    lo = start + part * per_part
    hi = tl.minimum(lo + per_part, stop)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = offs_m < n_q
    q = tl.load(Q + offs_m[:, None] * s_qm + head * s_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    if QK_FP8:
        # One scale per query row: its largest |q| maps to e4m3's 448 and the scale is folded
        # into the row's softmax factor, so small queries keep 3 mantissa bits.
        row_max = tl.maximum(tl.max(tl.abs(q.to(tl.float32)), 1), 1e-30)
        q_scaled = q.to(tl.float32) * (448.0 / row_max)[:, None]
        q = q_scaled.to(tl.float8e4nv)
        row_scale = qk_scale * (row_max / 448.0)
        # The rounding residual, itself rounded to e4m3 at the same scale, so both products
        # add into one accumulator (no rescaling between them): the pair carries each query
        # to about 2^-8 of its value, bf16's precision, and never worse than 2^-10 against
        # the row's largest value of 448. Unused (removed by the compiler) without QK_SPLIT.
        q_lo = (q_scaled - q.to(tl.float32)).to(tl.float8e4nv)
    else:
        row_scale = qk_scale
        q_lo = q
        if MMA_FP16:
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    m_i = tl.full([BLOCK_M], float('-inf'), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k_base = K + head * s_kh + offs_d[:, None]
    v_base = V + head * s_vh + offs_d[None, :]
    full_end = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N
    for n0 in range(lo, full_end, BLOCK_N):
        keys = n0 + offs_n
        k = tl.load(k_base + keys[None, :] * s_km)
        v = _widen(tl.load(v_base + keys[:, None] * s_vm), Q, MMA_FP16)
        m_i, l_i, acc = _block(q, q_lo, k, v, m_i, l_i, acc, row_scale, None, QK_FP8,
                               QK_SPLIT)
    if full_end < hi:
        keys = full_end + offs_n
        key_ok = keys < hi
        k = tl.load(k_base + keys[None, :] * s_km, mask=key_ok[None, :], other=0.0)
        v = _widen(tl.load(v_base + keys[:, None] * s_vm, mask=key_ok[:, None], other=0.0),
                   Q, MMA_FP16)
        m_i, l_i, acc = _block(q, q_lo, k, v, m_i, l_i, acc, row_scale, key_ok, QK_FP8,
                               QK_SPLIT)
    o_ptrs = Out + part * s_op + offs_m[:, None] * s_om + head * s_oh + offs_d[None, :]
    # An empty part (more parts than key tiles) has l = 0 and acc = 0: store 0, lse -inf.
    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    if NORMALISE:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, acc, mask=row_ok[:, None])
        # log2-sum-exp of the part's scaled scores; -inf for an empty part.
        tl.store(M + part * s_mp + head * s_mh + offs_m, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _widen(x, Q, MMA_FP16: tl.constexpr):
    """Widen a loaded K or V tile to the products' operand dtype (fp16 for FP8 K/V, else Q's)."""
    # One return: Triton checks every return statement's type, taken or not.
    if MMA_FP16:
        y = x.to(tl.float16)
    else:
        y = x.to(Q.dtype.element_ty)
    return y


@triton.jit
def _block(q, q_lo, k, v, m_i, l_i, acc, row_scale, key_ok, QK_FP8: tl.constexpr,
           QK_SPLIT: tl.constexpr):
    """Online-softmax update with one key tile ``k: [D, N]``, ``v: [N, D]`` (log2 domain).

    ``q_lo``: with ``QK_SPLIT``, the queries' second e4m3 term (the first's residual).

    ``row_scale``: the factor from ``q . k`` to log2 units (> 0): one per query row ``[M]``
    with ``QK_FP8`` (the rows' e4m3 scales folded in), else one scalar.
    """
    # Widened (or narrowed) in registers, right before the product: FP8 storage costs no
    # extra pass over memory.
    if QK_FP8:
        k = k.to(tl.float8e4nv)
        if QK_SPLIT:
            qk = tl.dot(q_lo, k, tl.dot(q, k))
        else:
            qk = tl.dot(q, k)
    else:
        k = k.to(q.dtype)
        qk = tl.dot(q, k)
    if key_ok is not None:
        qk = tl.where(key_ok[None, :], qk, float('-inf'))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * row_scale)
    # An all-masked row keeps m = -inf; shift by 0 there so exp2 gives 0, not NaN.
    shift = tl.where(m_new == float('-inf'), 0.0, m_new)
    if QK_FP8:
        p = tl.math.exp2(qk * row_scale[:, None] - shift[:, None])
    else:
        p = tl.math.exp2(qk * row_scale - shift[:, None])
    alpha = tl.math.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def merge_parts(P, M, Out, n_q, s_pp, s_pm, s_ph, s_mp, s_mh, s_om, s_oh,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr):
    """Average the parts' normalised outputs, weighted by their share exp2(lse - top)."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    top = tl.full([BLOCK_M], float('-inf'), dtype=tl.float32)
    for part in tl.static_range(SPLITS):
        lse = tl.load(M + part * s_mp + head * s_mh + offs_m, mask=row_ok, other=0.0)
        top = tl.maximum(top, lse)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for part in tl.static_range(SPLITS):
        lse = tl.load(M + part * s_mp + head * s_mh + offs_m, mask=row_ok, other=0.0)
        o = tl.load(P + part * s_pp + offs_m[:, None] * s_pm + head * s_ph + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        weight = tl.math.exp2(lse - top)
        total += weight
        acc += o * weight[:, None]
    acc = acc / total[:, None]
    tl.store(Out + offs_m[:, None] * s_om + head * s_oh + offs_d[None, :],
             acc.to(Out.dtype.element_ty), mask=row_ok[:, None])


def attend_run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor, *,
               splits: int = 4, block_m: int = 128, block_n: int = 64, num_warps: int = 4,
               num_stages: int = 2, qk_fp8: bool | None = None, qk_split: bool = True,
               out: torch.Tensor | None = None,
               scratch: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Attend ``q: [Q, H, D]`` to the keys ``k[start:stop]``, ``v[start:stop]`` (``[N, H, D]``).

    Args:
        q: Queries, bf16 or fp16 (the output dtype).
        k: Key token view, the dtype of ``q`` or float8_e4m3fn (widened in registers, to
            ``fp8.kernel_operand_dtype``).
        v: Value token view, likewise.
        bounds: int32 ``[start, stop]`` on the device of ``q`` (read by the kernel, so a CUDA
            graph of this call follows changes to it).
        splits: Key parts run by separate CTAs and merged (1: no merge kernel).
        block_m: Query tile.
        block_n: Key tile.
        num_warps: Warps per CTA.
        num_stages: Software-pipelining depth of the key loop.
        qk_fp8: Run the QK product in FP8 e4m3 (queries rounded to it with one scale per
            row, keys as stored or rounded). None: when ``k`` is FP8 and the device has FP8
            tensor cores (``fp8_products``), so FP8 keys go to them as they are (module
            docstring); on Ampere FP8 keys are widened.
        qk_split: With ``qk_fp8``, the queries go in as two e4m3 terms (two FP8 products,
            about bf16's query precision: the faithful form). False: one e4m3 term (half the
            QK products, outside the fidelity gate: ``cache.precision: fast_approximate``).
        out: Optional ``[Q, H, D]`` output buffer.
        scratch: Optional ``(parts [splits, Q, H, D] fp32, lse [splits, H, Q] fp32)``.

    Returns:
        ``[Q, H, D]`` in the dtype of ``q``.

    Raises:
        ValueError: shapes, dtypes or sizes the kernel does not take.
    """
    num_q, heads, dim = q.shape
    check_run_operands(q, k, v, bounds, splits)
    if qk_fp8 is None:
        qk_fp8 = k.dtype == torch.float8_e4m3fn and fp8_products(k.device)
    mma_fp16 = kernel_operand_dtype(q.dtype, k.dtype, v.dtype) == torch.float16 \
        and q.dtype != torch.float16
    if out is None:
        out = torch.empty_like(q)
    qk_scale = LOG2E / math.sqrt(dim)
    grid = (triton.cdiv(num_q, block_m), heads, splits)
    common = {'HEAD_DIM': dim, 'BLOCK_M': block_m, 'BLOCK_N': block_n, 'SPLITS': splits,
              'QK_FP8': qk_fp8, 'QK_SPLIT': bool(qk_fp8 and qk_split), 'MMA_FP16': mma_fp16,
              'num_warps': num_warps, 'num_stages': num_stages}
    if splits == 1:
        _attend_part[grid](q, k, v, out, out, bounds, num_q, qk_scale,
                           q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                           v.stride(0), v.stride(1), 0, out.stride(0), out.stride(1), 0, 0,
                           NORMALISE=True, **common)
        return out
    if scratch is None:
        scratch = (torch.empty(splits, num_q, heads, dim, dtype=torch.float32, device=q.device),
                   torch.empty(splits, heads, num_q, dtype=torch.float32, device=q.device))
    parts, lse = scratch
    _attend_part[grid](q, k, v, parts, lse, bounds, num_q, qk_scale,
                       q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                       v.stride(0), v.stride(1), parts.stride(0), parts.stride(1),
                       parts.stride(2), lse.stride(0), lse.stride(1),
                       NORMALISE=False, **common)
    merge_m = 64
    merge_parts[(triton.cdiv(num_q, merge_m), heads)](
        parts, lse, out, num_q, parts.stride(0), parts.stride(1), parts.stride(2),
        lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=dim, BLOCK_M=merge_m, SPLITS=splits, num_warps=4)
    return out


def check_run_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       bounds: torch.Tensor, splits: int) -> None:
    """Raise ValueError unless the operands suit the run kernels (this one, bench's variants)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or k.shape != v.shape \
            or k.shape[1:] != q.shape[1:]:
        raise ValueError(f'triton attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v '
                         f'{tuple(v.shape)} must be [Q, H, D] and [N, H, D] alike')
    if q.shape[2] not in (16, 32, 64, 128):
        raise ValueError(f'triton attention: head dim {q.shape[2]} is not 16, 32, 64 or 128')
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f'triton attention: queries must be bf16 or fp16, not {q.dtype}')
    for name, t in (('k', k), ('v', v)):
        if t.dtype not in (q.dtype, torch.float8_e4m3fn):
            raise ValueError(f'triton attention: {name} is {t.dtype}; it must be {q.dtype} or '
                             'float8_e4m3fn')
        if t.stride(2) != 1:
            raise ValueError(f'triton attention: {name} must be contiguous in its last dim')
    if q.stride(2) != 1:
        raise ValueError('triton attention: q must be contiguous in its last dim')
    if bounds.dtype != torch.int32 or bounds.numel() < 2 or bounds.device != q.device:
        raise ValueError('triton attention: bounds must be int32 [start, stop] on the device '
                         'of q')
    if splits < 1:
        raise ValueError(f'triton attention: splits={splits} must be >= 1')
    if max(k.numel(), v.numel(), q.numel()) >= 2**31:
        raise ValueError('triton attention: a tensor of 2^31 elements or more (the kernel '
                         'indexes with int32)')
