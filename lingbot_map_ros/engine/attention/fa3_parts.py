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
"""The key run cut into ``P`` parts, each a sequence of one varlen call; and their merge.

Shapes: ``q: [Q, H, D]``; ``bounds = [start, stop]`` (int32, on the device); ``P`` parts.

Why: FA3's FP8 kernel at our shape runs 6 query tiles x 16 heads = 96 CTAs per key split on
the H200's 132 SMs; its plain entry with 4 splits (384 CTAs, 2.9 waves) takes 0.547 ms
against 0.683 with one, but through the varlen entry (the one whose key range can live on
the device, as a CUDA graph of a frame needs) every split count above one ran at ~0.72 ms
(bench/results/h200_round9/). Cutting the run into ``P`` sequences of one varlen call gives
the same grid as ``P`` splits and leaves the merge to us.

``prepare_parts`` writes, in one launch, the queries ``P`` times (``q_parts: [P * Q, H, D]``;
cast to e4m3 for FP8 pools, saturated at +-448) and the keys' sequence starts ``cu_k: [P + 1]``
(part ``i`` is ``[start + (stop - start) * i // P, start + (stop - start) * (i + 1) // P)``).
``merge_parts`` combines the parts' outputs ``o: [P * Q, H, D]`` by their natural-log
sum-exps ``lse: [H, P * Q]`` (FA3's varlen layout) into ``out: [Q, H, D]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

E4M3_MAX = 448.0
BLOCK_M = 64


@triton.jit
def _prepare(Q, QP, Bounds, CuK, n_q, s_qm, s_qh, s_pm, s_ph,
             PARTS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
             TO_FP8: tl.constexpr, FP8_MAX: tl.constexpr):
    block, head = tl.program_id(0), tl.program_id(1)
    offs_m = block * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = (offs_m < n_q)[:, None]
    x = tl.load(Q + offs_m[:, None] * s_qm + head * s_qh + offs_d[None, :], mask=ok, other=0.0)
    if TO_FP8:
        x = tl.clamp(x.to(tl.float32), -FP8_MAX, FP8_MAX)
    y = x.to(QP.dtype.element_ty)
    for part in tl.static_range(PARTS):
        rows = part * n_q + offs_m
        tl.store(QP + rows[:, None] * s_pm + head * s_ph + offs_d[None, :], y, mask=ok)
    if (block == 0) & (head == 0):
        start = tl.load(Bounds)
        span = tl.load(Bounds + 1) - start
        for part in tl.static_range(PARTS + 1):
            tl.store(CuK + part, start + (span * part) // PARTS)


@triton.jit
def _merge(Parts, Lse, Out, n_q, s_om, s_oh, s_lh, s_outm, s_outh,
           PARTS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    block, head = tl.program_id(0), tl.program_id(1)
    offs_m = block * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    live = offs_m < n_q
    top = tl.full([BLOCK], -float('inf'), dtype=tl.float32)
    for part in tl.static_range(PARTS):
        lse = tl.load(Lse + head * s_lh + part * n_q + offs_m, mask=live, other=0.0)
        # A part without keys has no finite sum-exp (FA3 writes -inf): it weighs nothing.
        lse = tl.where(lse == lse, lse, -float('inf'))
        top = tl.maximum(top, lse)
    top = tl.where(top > -float('inf'), top, 0.0)
    acc = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for part in tl.static_range(PARTS):
        lse = tl.load(Lse + head * s_lh + part * n_q + offs_m, mask=live, other=0.0)
        lse = tl.where(lse == lse, lse, -float('inf'))
        weight = tl.exp(lse - top)
        rows = part * n_q + offs_m
        o = tl.load(Parts + rows[:, None] * s_om + head * s_oh + offs_d[None, :],
                    mask=live[:, None], other=0.0).to(tl.float32)
        acc += weight[:, None] * o
        total += weight
    acc = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(Out + offs_m[:, None] * s_outm + head * s_outh + offs_d[None, :],
             acc.to(Out.dtype.element_ty), mask=live[:, None])


def _check(q: torch.Tensor, what: str) -> None:
    if q.dim() != 3 or q.stride(2) != 1 or q.shape[2] not in (16, 32, 64, 128, 256):
        raise ValueError(f'{what}: expected [Q, H, D] contiguous in D with D a power of two in '
                         f'[16, 256]; got {tuple(q.shape)}')


def prepare_parts(q: torch.Tensor, bounds: torch.Tensor, q_parts: torch.Tensor,
                  cu_k: torch.Tensor) -> None:
    """Write ``q`` into each part of ``q_parts`` (cast to its dtype) and the parts' key starts.

    Raises:
        ValueError: shapes that do not fit (``q_parts`` must be ``[P * Q, H, D]``).
    """
    _check(q, 'prepare_parts')
    num_q, heads, dim = q.shape
    parts = cu_k.numel() - 1
    if q_parts.shape != (parts * num_q, heads, dim) or q_parts.stride(2) != 1 or parts < 1:
        raise ValueError(f'prepare_parts: q_parts {tuple(q_parts.shape)} is not [{parts} * '
                         f'{num_q}, {heads}, {dim}]')
    _prepare[(triton.cdiv(num_q, BLOCK_M), heads)](
        q, q_parts, bounds, cu_k, num_q, q.stride(0), q.stride(1), q_parts.stride(0),
        q_parts.stride(1), PARTS=parts, HEAD_DIM=dim, BLOCK=BLOCK_M,
        TO_FP8=q_parts.dtype == torch.float8_e4m3fn, FP8_MAX=E4M3_MAX)


def merge_parts(o: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Merge ``o: [P * Q, H, D]`` by ``lse: [H, P * Q]`` into ``out: [Q, H, D]``; return it.

    Raises:
        ValueError: shapes that do not fit.
    """
    _check(out, 'merge_parts')
    num_q, heads, dim = out.shape
    parts = o.shape[0] // max(num_q, 1)
    if o.shape != (parts * num_q, heads, dim) or lse.shape != (heads, parts * num_q) \
            or o.stride(2) != 1 or lse.stride(1) != 1 or parts < 1:
        raise ValueError(f'merge_parts: o {tuple(o.shape)}, lse {tuple(lse.shape)} do not '
                         f'fit out {tuple(out.shape)}')
    _merge[(triton.cdiv(num_q, BLOCK_M), heads)](
        o, lse, out, num_q, o.stride(0), o.stride(1), lse.stride(0), out.stride(0),
        out.stride(1), PARTS=parts, HEAD_DIM=dim, BLOCK=BLOCK_M)
    return out
