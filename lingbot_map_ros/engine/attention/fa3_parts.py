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

Shapes: ``q: [Q, H, D]``, or ``[B, Q, H, D]`` for ``B`` runs (the frames of a batch of streams,
each over its own run); ``bounds = [start, stop]`` per run (int32, on the device); ``P`` parts.

Why: FA3's FP8 kernel at our shape runs 6 query tiles x 16 heads = 96 CTAs per key split,
fewer than a Hopper GPU has SMs; its plain entry fills the GPU with a few key splits, but
through the varlen entry (the one whose key range can live on the device, as a CUDA graph of a
frame needs) more splits gained nothing (docs/performance.md, 'FA3 in parts'). Cutting the
run into ``P`` sequences of one varlen call gives the same grid as ``P`` splits and leaves the
merge to us. ``B`` runs are ``B * P`` sequences of that one call: one launch for a batch of
streams instead of one per stream.

``prepare_parts`` writes, in one launch, the queries ``P`` times (``q_parts: [B * P * Q, H, D]``,
sequence ``b * P + i`` holds run b's queries; cast to e4m3 for FP8 pools, saturated at +-448)
and the keys' sequence starts ``cu_k: [B * P + 1]`` (part ``i`` of a run is
``[start + (stop - start) * i // P, start + (stop - start) * (i + 1) // P)``). One run's parts
follow each other, so ``cu_k`` alone gives their lengths; the runs of several streams lie
anywhere in the pool, so then each sequence's length goes to ``used: [B * P]`` (FA3's
``seqused_k``). ``merge_parts`` combines the parts' outputs ``o: [B * P * Q, H, D]`` by their
natural-log sum-exps ``lse: [H, B * P * Q]`` (FA3's varlen layout) into ``out``, shaped as ``q``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

E4M3_MAX = 448.0
BLOCK_M = 64


@triton.jit
def _prepare(Q, QP, Bounds, CuK, Used, n_q, n_runs, s_qb, s_qm, s_qh, s_pm, s_ph, s_bb,
             PARTS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
             TO_FP8: tl.constexpr, FP8_MAX: tl.constexpr, USED: tl.constexpr):
    block, head, run = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = block * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = (offs_m < n_q)[:, None]
    x = tl.load(Q + run * s_qb + offs_m[:, None] * s_qm + head * s_qh + offs_d[None, :],
                mask=ok, other=0.0)
    if TO_FP8:
        x = tl.clamp(x.to(tl.float32), -FP8_MAX, FP8_MAX)
    y = x.to(QP.dtype.element_ty)
    for part in tl.static_range(PARTS):
        rows = (run * PARTS + part) * n_q + offs_m
        tl.store(QP + rows[:, None] * s_pm + head * s_ph + offs_d[None, :], y, mask=ok)
    if (block == 0) & (head == 0):
        start = tl.load(Bounds + run * s_bb)
        span = tl.load(Bounds + run * s_bb + 1) - start
        for part in tl.static_range(PARTS):
            lo = start + (span * part) // PARTS
            tl.store(CuK + run * PARTS + part, lo)
            if USED:
                tl.store(Used + run * PARTS + part, start + (span * (part + 1)) // PARTS - lo)
        if run == n_runs - 1:
            tl.store(CuK + n_runs * PARTS, start + span)


@triton.jit
def _merge(Parts, Lse, Out, n_q, s_om, s_oh, s_lh, s_outb, s_outm, s_outh,
           PARTS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    block, head, run = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first = run * PARTS * n_q
    offs_m = block * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    live = offs_m < n_q
    top = tl.full([BLOCK], -float('inf'), dtype=tl.float32)
    for part in tl.static_range(PARTS):
        lse = tl.load(Lse + head * s_lh + first + part * n_q + offs_m, mask=live,
                      other=0.0)
        # A part without keys has no finite sum-exp (FA3 writes -inf): it weighs nothing.
        lse = tl.where(lse == lse, lse, -float('inf'))
        top = tl.maximum(top, lse)
    top = tl.where(top > -float('inf'), top, 0.0)
    acc = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for part in tl.static_range(PARTS):
        lse = tl.load(Lse + head * s_lh + first + part * n_q + offs_m, mask=live,
                      other=0.0)
        lse = tl.where(lse == lse, lse, -float('inf'))
        weight = tl.exp(lse - top)
        rows = first + part * n_q + offs_m
        o = tl.load(Parts + rows[:, None] * s_om + head * s_oh + offs_d[None, :],
                    mask=live[:, None], other=0.0).to(tl.float32)
        acc += weight[:, None] * o
        total += weight
    acc = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(Out + run * s_outb + offs_m[:, None] * s_outm + head * s_outh + offs_d[None, :],
             acc.to(Out.dtype.element_ty), mask=live[:, None])


def _runs(t: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` as ``[B, Q, H, D]`` (a view; ``[Q, H, D]`` is one run), contiguous in D."""
    if t.dim() == 3:
        t = t.unsqueeze(0)
    if t.dim() != 4 or t.stride(3) != 1 or t.shape[3] not in (16, 32, 64, 128, 256):
        raise ValueError(f'{what}: expected [Q, H, D] or [B, Q, H, D] contiguous in D with D a '
                         f'power of two in [16, 256]; got {tuple(t.shape)}')
    return t


def prepare_parts(q: torch.Tensor, bounds: torch.Tensor, q_parts: torch.Tensor,
                  cu_k: torch.Tensor, used: torch.Tensor | None = None) -> None:
    """Write ``q`` into each part of ``q_parts`` (cast to its dtype) and the parts' key starts.

    Args:
        q: ``[Q, H, D]`` (one run) or ``[B, Q, H, D]``.
        bounds: ``[2]``, or ``[B, >= 2]`` with each run's ``start, stop`` first in its row.
        q_parts: ``[B * P * Q, H, D]``, written.
        cu_k: ``[B * P + 1]`` int32, written: each sequence's first key.
        used: ``[B * P]`` int32, written: each sequence's key count; needed for ``B > 1``.

    Raises:
        ValueError: shapes that do not fit.
    """
    q = _runs(q, 'prepare_parts')
    runs, num_q, heads, dim = q.shape
    parts = (cu_k.numel() - 1) // runs
    bounds = bounds.reshape(1, -1) if bounds.dim() == 1 else bounds
    if parts < 1 or cu_k.numel() != runs * parts + 1 \
            or q_parts.shape != (runs * parts * num_q, heads, dim) or q_parts.stride(2) != 1:
        raise ValueError(f'prepare_parts: q_parts {tuple(q_parts.shape)}, cu_k '
                         f'{tuple(cu_k.shape)} do not fit {runs} run(s) of {num_q} queries, '
                         f'{heads} heads of {dim}')
    if bounds.shape[0] != runs or bounds.shape[1] < 2 or bounds.stride(1) != 1 \
            or (used is None and runs > 1) \
            or (used is not None and used.shape != (runs * parts,)):
        raise ValueError(f'prepare_parts: bounds {tuple(bounds.shape)} and used '
                         f'{None if used is None else tuple(used.shape)} do not fit {runs} '
                         f'run(s) of {parts} parts (several runs need used)')
    _prepare[(triton.cdiv(num_q, BLOCK_M), heads, runs)](
        q, q_parts, bounds, cu_k, cu_k if used is None else used, num_q, runs, q.stride(0),
        q.stride(1), q.stride(2), q_parts.stride(0), q_parts.stride(1), bounds.stride(0),
        PARTS=parts, HEAD_DIM=dim, BLOCK=BLOCK_M, TO_FP8=q_parts.dtype == torch.float8_e4m3fn,
        FP8_MAX=E4M3_MAX, USED=used is not None)


def merge_parts(o: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Merge ``o: [B * P * Q, H, D]`` by ``lse: [H, B * P * Q]`` into ``out``; return it.

    ``out`` is ``[Q, H, D]`` (one run) or ``[B, Q, H, D]``.

    Raises:
        ValueError: shapes that do not fit.
    """
    runs_out = _runs(out, 'merge_parts')
    runs, num_q, heads, dim = runs_out.shape
    parts = o.shape[0] // max(runs * num_q, 1)
    if o.shape != (runs * parts * num_q, heads, dim) \
            or lse.shape != (heads, runs * parts * num_q) \
            or o.stride(2) != 1 or lse.stride(1) != 1 or parts < 1:
        raise ValueError(f'merge_parts: o {tuple(o.shape)}, lse {tuple(lse.shape)} do not '
                         f'fit out {tuple(out.shape)}')
    _merge[(triton.cdiv(num_q, BLOCK_M), heads, runs)](
        o, lse, runs_out, num_q, o.stride(0), o.stride(1), lse.stride(0), runs_out.stride(0),
        runs_out.stride(1), runs_out.stride(2), PARTS=parts, HEAD_DIM=dim, BLOCK=BLOCK_M)
    return out
