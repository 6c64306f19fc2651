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
"""Queries into FP8 e4m3 with one scale per head, in one kernel launch.

Shapes: ``q: [Q, H, D]`` (bf16 or fp16) -> ``q8: [Q, H, D]`` (``float8_e4m3fn``) and
``descale: [1, H]`` (float32), ``q ~= q8 * descale[0, h]``: FlashAttention-3's FP8 forward takes
``q_descale`` per (batch, head), so a per-head scale costs it nothing and keeps each head's
largest query at e4m3's top (448) instead of sharing one scale across heads.

Why a kernel: the same in torch is six launches (abs, amax, clamp, divide, divide the queries,
cast), 144 per frame over the 24 cache layers inside the whole-frame graph; this is one. One
program per head reads its ``Q x D`` queries twice (the max, then the scaled cast): at our shape
2 MB per layer, a few microseconds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

E4M3_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` value."""


@triton.jit
def _quantize_heads(Q, Q8, Descale, n_q, s_qm, s_qh, s_8m, s_8h,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, FP8_MAX: tl.constexpr):
    """One head: its absolute max, then every query divided by max / FP8_MAX, cast to e4m3."""
    head = tl.program_id(0)
    offs_d = tl.arange(0, HEAD_DIM)
    top = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for m0 in range(0, n_q, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        x = tl.load(Q + offs_m[:, None] * s_qm + head * s_qh + offs_d[None, :],
                    mask=(offs_m < n_q)[:, None], other=0.0)
        top = tl.maximum(top, tl.abs(x.to(tl.float32)))
    # An all-zero head keeps a tiny positive scale: zeros stay zeros, no 0/0.
    scale = tl.maximum(tl.max(tl.max(top, 1), 0), 1e-12) / FP8_MAX
    for m0 in range(0, n_q, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        ok = (offs_m < n_q)[:, None]
        x = tl.load(Q + offs_m[:, None] * s_qm + head * s_qh + offs_d[None, :], mask=ok,
                    other=0.0)
        y = tl.clamp(x.to(tl.float32) / scale, -FP8_MAX, FP8_MAX)
        tl.store(Q8 + offs_m[:, None] * s_8m + head * s_8h + offs_d[None, :],
                 y.to(Q8.dtype.element_ty), mask=ok)
    tl.store(Descale + head, scale)


def quantize_queries(q: torch.Tensor, out: torch.Tensor | None = None,
                     descale: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(q8 [Q, H, D] float8_e4m3fn, descale [1, H] float32)`` of ``q: [Q, H, D]``.

    Args:
        q: bf16 or fp16 queries, contiguous in the last dim.
        out: Optional e4m3 buffer shaped like ``q``.
        descale: Optional float32 ``[1, H]`` buffer.

    Raises:
        ValueError: a shape, dtype or head dim the kernel does not take.
    """
    if q.dim() != 3 or q.dtype not in (torch.bfloat16, torch.float16) or q.stride(2) != 1:
        raise ValueError(f'quantize_queries: q must be [Q, H, D] bf16/fp16, contiguous in D; '
                         f'got {tuple(q.shape)} {q.dtype}')
    num_q, heads, dim = q.shape
    if dim not in (16, 32, 64, 128, 256):
        raise ValueError(f'quantize_queries: head dim {dim} is not a power of two in [16, 256]')
    if out is None:
        out = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
    if descale is None:
        descale = torch.empty(1, heads, dtype=torch.float32, device=q.device)
    _quantize_heads[(heads,)](q, out, descale, num_q, q.stride(0), q.stride(1),
                              out.stride(0), out.stride(1), HEAD_DIM=dim,
                              BLOCK_M=max(16, 4096 // dim), FP8_MAX=E4M3_MAX, num_warps=4)
    return out, descale
