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
"""Backend ``fa3``: FlashAttention-3's forward (the ``fa3-fwd`` wheel) over the visible run.

Shapes: ``Q`` queries, ``H`` heads, ``D`` head dim; keys and values as token views ``[N, H, D]``
of a layer's pool, the visible run ``[start, stop)`` in the device tensor ``bounds``.

It runs as the ``triton`` backend does (``TritonBackend``: one call per layer, inside the
whole-frame graph) with FA3's varlen entry as the kernel: the key range comes from the device,
so no shape depends on the frame. By default the run is cut into 4 parts, sequences of the one
varlen call, merged by their sum-exps (``fa3_parts.py``): at our shape that is the grid FA3's
plain entry reaches with 4 KV splits, which its varlen entry does not (more splits gain nothing
there; docs/performance.md, 'FA3 in parts').
A batch of cameras attends all its runs in one such call (``attend_runs``), each run's last
queries past FA3's 192-row tiles on our Triton kernel (``cache.kernel.fa3_joint_tail_rows``).

FP8 pools (``cache.dtype: float8_e4m3fn``, unit scale) run FA3's FP8 kernel: QK and PV on the
FP8 tensor cores, K and V read as stored (no widening pass, no copy), the queries cast to e4m3
(``cache.kernel.fa3_query_scale``: unscaled, or one scale per head, with or without parts),
the K/V descales 1 (the storage's unit scale, ``fp8.py``);
FA3 rounds the softmax probabilities to e4m3 for PV itself. Its output is bf16.

``cache.backend: auto`` takes it on Hopper where the wheel loads, as ``backend_choice.py`` says:
its bf16 kernel for bf16 K/V, its FP8 kernel only under ``cache.precision: fast_approximate``
(faster than our Triton kernel, outside the fidelity gate: docs/performance.md). Hopper only
(FA3 is built for sm_90); the wheel is optional (built for torch 2.10, it loads under 2.11).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from typing import Any

from lingbot_map_ros.engine.attention.triton_backend import TritonBackend
from lingbot_map_ros.kernel_config import KernelConfig
import torch

FA3_QUERY_TILE = 192
"""Query rows per CTA of FA3's forward at head dim 64 (bf16 and FP8): a run's queries past the
last multiple of it make one more tile per head and key part, padded to 192 rows."""
E4M3_MAX = 448.0
"""Largest finite e4m3 magnitude (the queries' per-head scale maps each head's top to it)."""
TAIL_KERNEL: dict[str, Any] = {'block_m': 64, 'block_n': 64, 'num_warps': 4, 'num_stages': 3,
                               'qk_split': False}
"""Our Triton kernel's config for the tail rows (``triton_attention.attend_run``, one query
tile; its key parts are ``cache.kernel.fa3_tail_splits``, so that the heads fill the GPU)."""


def import_fa3() -> tuple[Any, Any]:
    """Import FA3's varlen forward and its forward op (which also returns the sum-exps).

    Raises:
        ImportError: the ``fa3-fwd`` package is not installed.
    """
    try:
        from fa3_fwd_interface import _flash_attn_forward, flash_attn_varlen_func
    except ImportError as exc:
        raise ImportError("attention backend 'fa3' needs the fa3-fwd package "
                          '(FlashAttention-3 forward for Hopper: pip install fa3-fwd); or '
                          "choose backend 'auto', 'triton' or 'sdpa'") from exc
    return flash_attn_varlen_func, _flash_attn_forward


def unit_scale_queries(q: torch.Tensor) -> torch.Tensor:
    """``q`` as e4m3 without a scale, saturated at +-448 (a plain cast would give NaN there)."""
    return q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def head_scaled_queries(q: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale each run's heads of ``q`` to e4m3's range: ``(q / scale, descale per sequence)``.

    ``q`` is ``[Q, H, D]`` (one run) or ``[B, Q, H, D]``; the scale of a head is its largest
    magnitude over the run's queries / 448 (1 for an all-zero head). Returns the scaled
    queries in float32 (``prepare_parts`` casts them to e4m3) and the descales ``[B * parts,
    H]`` float32, each run's row repeated for its ``parts`` sequences (FA3's ``q_descale``).
    Device ops only: capturable in a CUDA graph.
    """
    amax = q.float().abs().amax(dim=(-3, -1))  # [H] or [B, H]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    scaled = q.float() / scale[..., None, :, None]
    rows = scale.reshape(-1, 1, scale.shape[-1]).expand(-1, parts, scale.shape[-1])
    return scaled, rows.reshape(-1, scale.shape[-1]).contiguous()


class Fa3RunAttention:
    """FA3 over a device-side run ``(q, k, v, bounds)``, the ``triton`` kernel's signature.

    The knobs are ``cache.kernel.fa3_*`` (``KernelConfig``); an argument given here replaces
    its field (the benchmarks' candidates).

    Args:
        num_splits: FA3's KV splits; 0 lets its heuristic choose (``fa3_splits``).
        query_scale: ``head`` or ``unit`` (``fa3_query_scale``).
        parts: sequences the run is cut into (``fa3_parts``).
        joint_parts: the same per run for several runs (``fa3_joint_parts``).
        joint_tail_rows: in a call of several runs, the most rows past FA3's last full
            query tile that our Triton kernel takes, 0: none (``fa3_joint_tail_rows``).
        tail_splits: key parts of our kernel over those rows (``fa3_tail_splits``).
        config: ``cache.kernel`` (None: the defaults).
        kernels: FA3's ``(flash_attn_varlen_func, _flash_attn_forward)`` (None: imported from
            ``fa3-fwd``); the conformance tests give a float64 equivalent to check the parts
            and their merge on the CPU.

    Raises:
        ValueError: a value ``KernelConfig`` refuses.
        ImportError: the ``fa3-fwd`` package is not installed.
    """

    def __init__(self, num_splits: int | None = None, query_scale: str | None = None,
                 parts: int | None = None, joint_parts: int | None = None,
                 joint_tail_rows: int | None = None, tail_splits: int | None = None,
                 config: KernelConfig | None = None,
                 kernels: tuple[Any, Any] | None = None) -> None:
        given = {'fa3_splits': num_splits, 'fa3_query_scale': query_scale, 'fa3_parts': parts,
                 'fa3_joint_parts': joint_parts, 'fa3_joint_tail_rows': joint_tail_rows,
                 'fa3_tail_splits': tail_splits}
        config = dataclasses.replace(config or KernelConfig(),
                                     **{k: v for k, v in given.items() if v is not None})
        self.config = config
        """The ``cache.kernel`` this kernel runs with (the arguments given laid over it)."""
        self._attend, self._forward = kernels if kernels is not None else import_fa3()
        self._num_splits = config.fa3_splits
        self._query_scale = config.fa3_query_scale
        self._parts = config.fa3_parts
        self._joint_parts = config.fa3_joint_parts
        self._tail_rows = config.fa3_joint_tail_rows if self._parts > 1 else 0
        self._tail_kernel = {**TAIL_KERNEL, 'splits': config.fa3_tail_splits}
        # The Triton helpers are imported here, once, not per layer call (and not at module
        # level: the CPU tests import this module without triton).
        if self._parts > 1:
            from lingbot_map_ros.engine.attention.fa3_parts import merge_parts, prepare_parts
            self._prepare_parts, self._merge_parts = prepare_parts, merge_parts
        if self._tail_rows:
            from lingbot_map_ros.engine.attention.triton_attention import attend_run
            self._tail = attend_run
        if self._parts == 1 and self._query_scale == 'head':
            from lingbot_map_ros.engine.attention.triton_quant import quantize_queries
            self._quantize_queries = quantize_queries
        self._constants_of: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _constants(self, sequences: int, num_q: int, heads: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the query sequence starts (``sequences`` of ``num_q``) and unit descales.

        Kept per shape: a batch of streams (several runs) and a lone frame alternate.
        """
        key = (sequences, num_q, heads, device)
        if key not in self._constants_of:
            self._constants_of[key] = (
                torch.arange(sequences + 1, dtype=torch.int32, device=device) * num_q,
                torch.ones(sequences, heads, dtype=torch.float32, device=device))
        return self._constants_of[key]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 bounds: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to ``k[start:stop]``, ``v[start:stop]``; ``[Q, H, D]``."""
        num_q, heads = q.shape[0], q.shape[1]
        if self._parts > 1:
            return self._parted(q, k, v, bounds)
        cu_q, ones = self._constants(1, num_q, heads, q.device)
        extra: dict[str, Any] = {}
        out_dtype = q.dtype
        if k.dtype == torch.float8_e4m3fn:
            if self._query_scale == 'unit':
                q, q_descale = unit_scale_queries(q), ones
            else:
                q, q_descale = self._quantize_queries(q)
            extra = {'q_descale': q_descale, 'k_descale': ones, 'v_descale': ones}
        # The bounds are int32 [start, stop] on the device: sequence 0's keys start at
        # cu_seqlens_k[0]. max_seqlen_k is an upper bound fixed per pool, so the launch (and a
        # graph of it) does not depend on the frame.
        out = self._attend(q, k, v, cu_q, bounds[0:2], num_q, k.shape[0],
                           num_splits=self._num_splits, **extra)
        out = out[0] if isinstance(out, tuple) else out
        return out if out.dtype == out_dtype else out.to(out_dtype)

    @property
    def attend_runs(self) -> Callable[..., torch.Tensor] | None:
        """Return the attention of several runs in one launch, or None (one part: no merge).

        ``attend_runs(q: [B, Q, H, D], k, v, bounds: [B, >= 2]) -> [B, Q, H, D]``: run b's
        queries over its own ``k[start_b:stop_b]``; the runs may lie anywhere in ``k``.
        """
        return self._parted if self._parts > 1 else None

    def _parted(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                bounds: torch.Tensor) -> torch.Tensor:
        """Attend over each run as parts of one varlen call, merged by sum-exps.

        ``q`` is ``[Q, H, D]`` (one run, ``bounds = [start, stop]``) or ``[B, Q, H, D]`` (B
        runs, ``bounds: [B, >= 2]``); so is the result. Every buffer is allocated per call
        (the graph's pool when captured): one kernel object serves every layer and batch.
        """
        out = torch.empty_like(q)
        num_q = q.shape[-3]
        tail = num_q % FA3_QUERY_TILE
        if q.dim() == 3 or not 0 < tail <= self._tail_rows or tail == num_q:
            return self._fa3_parts(q, k, v, bounds, out)
        # Several runs: FA3 takes the full query tiles; each run's last few rows go to our
        # kernel over its own bounds (what FA3 would give them, without a padded tile per head
        # and part: a sixth of FA3's work at 978 queries).
        main = num_q - tail
        self._fa3_parts(q[:, :main], k, v, bounds, out[:, :main])
        for run in range(q.shape[0]):
            self._tail(q[run, main:], k, v, bounds[run, 0:2], out=out[run, main:],
                       **self._tail_kernel)
        return out

    def _fa3_parts(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   bounds: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """FA3 over ``parts`` sequences per run (``joint_parts`` for several), into ``out``."""
        num_q, heads, dim = q.shape[-3:]
        runs = q.shape[0] if q.dim() == 4 else 1
        sequences = runs * (self._parts if runs == 1 else self._joint_parts)
        cu_q, ones = self._constants(sequences, num_q, heads, q.device)
        fp8 = k.dtype == torch.float8_e4m3fn
        q_parts = torch.empty(sequences * num_q, heads, dim, device=q.device,
                              dtype=k.dtype if fp8 else q.dtype)
        cu_k = torch.empty(sequences + 1, dtype=torch.int32, device=q.device)
        # One run's parts follow each other (cu_k gives their lengths); several runs need
        # each sequence's length (FA3's seqused_k).
        used = torch.empty(sequences, dtype=torch.int32, device=q.device) if runs > 1 else None
        q_descale = ones
        if fp8 and self._query_scale == 'head':
            q, q_descale = head_scaled_queries(q, sequences // runs)
        self._prepare_parts(q, bounds, q_parts, cu_k, used)
        descales = {'q_descale': q_descale, 'k_descale': ones, 'v_descale': ones} if fp8 else {}
        o, lse = self._forward(q_parts, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               seqused_k=used, max_seqlen_q=num_q, max_seqlen_k=k.shape[0],
                               softmax_scale=dim ** -0.5, num_splits=1, **descales)[:2]
        return self._merge_parts(o, lse, out)


class Fa3Backend(TritonBackend):
    """Backend ``fa3``: the ``triton`` backend's run handling with FA3 as the kernel."""

    name = 'fa3'

    def __init__(self, device: torch.device, config: KernelConfig | None = None) -> None:
        super().__init__(device, kernel=Fa3RunAttention(config=config))
