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
"""Backend ``triton``: the cache attention through our Triton kernel (``triton_attention.py``).

CUDA only; needs the ``triton`` package (shipped with PyTorch's CUDA wheels). The kernel reads
the visible run ``[start, stop)`` of a layer's pool from a device tensor, so, unlike the
``sdpa`` backend, it needs no cuDNN plan per key count and no patch/special split: one launch
(plus the small merge of the key parts) per layer, and one CUDA graph per frame kind. It reads
FP8 pools as they are (no widened copy). A layout that is not one contiguous run is gathered
first, as ``sdpa`` does.

The kernel's tile configuration is ``KERNEL_CONFIG``; ``bench/attention_kernels.py`` measures
the candidates. For benchmarking only, ``LINGBOT_MAP_TRITON_CONFIG`` (a JSON object with the
same keys) replaces it, and the replacement is logged.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, TYPE_CHECKING

from lingbot_map_ros.engine.attention.fp8 import attention_dtype
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.attention.staged import StagedAttention
    from lingbot_map_ros.engine.cache.page_table import PageLayout

logger = logging.getLogger(__name__)

KERNEL_CONFIG: dict[str, Any] = {'block_m': 128, 'block_n': 64, 'num_warps': 4,
                                 'num_stages': 3, 'splits': 2}
"""Tiles, warps, pipelining depth and key parts of the kernel at the cache shape: the best of
the H200 sweep (bench/results/h200_final/attention_kernels.txt: 0.719 ms, 407 TFLOP/s; the
earlier 2 stages x 4 parts took 0.905 ms)."""


FAST_KEYS = frozenset({'fp8', 'exp_split'})
"""Config keys that select the variant kernel ``triton_fp8.attend_run_fast`` when true."""


def env_override(name: str, known: set[str]) -> dict[str, Any] | None:
    """Return the JSON object in environment variable ``name`` (None where it is unset).

    For benchmarks: a kernel's tile or split configuration replaced without editing code.

    Raises:
        ValueError: the value is not a JSON object whose keys are all in ``known``.
    """
    raw = os.environ.get(name, '')
    if not raw:
        return None
    try:
        override = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f'{name} is not JSON: {raw!r}') from exc
    if not isinstance(override, dict) or not set(override) <= known:
        raise ValueError(f'{name}={raw!r} must be a JSON object with keys from {sorted(known)}')
    return override


def kernel_config() -> dict[str, Any]:
    """Return ``KERNEL_CONFIG``, or the benchmark override from ``LINGBOT_MAP_TRITON_CONFIG``.

    Raises:
        ValueError: the override is not a JSON object of known keys.
    """
    known = set(KERNEL_CONFIG) | {'qk_fp8', 'qk_split'} | FAST_KEYS
    override = env_override('LINGBOT_MAP_TRITON_CONFIG', known)
    if override is None:
        return dict(KERNEL_CONFIG)
    logger.info('Triton cache attention: kernel config %s (LINGBOT_MAP_TRITON_CONFIG)', override)
    return {**KERNEL_CONFIG, **override}


def import_triton_kernel() -> Any:
    """Import ``attend_run``, or raise ImportError saying what is missing.

    Raises:
        ImportError: triton is not installed.
    """
    try:
        from lingbot_map_ros.engine.attention.triton_attention import attend_run
    except ImportError as exc:
        raise ImportError("attention backend 'triton' needs the triton package (it comes with "
                          "PyTorch's CUDA wheels); or choose backend 'sdpa'") from exc
    return attend_run


class TritonRunAttention:
    """The kernel over a device-side run, with its config and scratch kept between calls.

    Args:
        precision: ``cache.precision``. 'faithful': FP8 keys meet queries carried in two e4m3
            terms (``qk_split``, about bf16's query precision); 'fast_approximate': one term.
    """

    def __init__(self, precision: str = 'faithful') -> None:
        self._attend = import_triton_kernel()
        self._config = kernel_config()
        if any(self._config.get(key) for key in FAST_KEYS):
            from lingbot_map_ros.engine.attention.triton_fp8 import attend_run_fast
            self._attend = attend_run_fast
        else:
            self._config.setdefault('qk_split', precision == 'faithful')

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 bounds: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to ``k[start:stop]``, ``v[start:stop]`` (token views)."""
        return self._attend(q, k, v, bounds, **self._config)


class TritonBackend:
    """Backend ``triton``: the visible run's bounds go to the kernel as a device tensor."""

    name = 'triton'
    graph_support = 'whole_frame'  # the kernel reads the run's bounds from the device
    fallbacks = 0  # one kernel, nothing to step down to

    def __init__(self, device: torch.device, kernel: Any = None,
                 precision: str = 'faithful') -> None:
        from lingbot_map_ros.engine.attention.sdpa import _PageGather

        # Another kernel over a device-side run (``fa3.py``) reuses the rest as it is.
        self.kernel = kernel if kernel is not None else TritonRunAttention(precision)
        self._bounds = torch.zeros(2, dtype=torch.int32, device=device)
        self._host_bounds = (-1, -1)
        self._gather = _PageGather()

    def staged_attention(self, page_size: int, full_patch_pages: int, num_special_tokens: int,
                         device: torch.device, compile_merge: bool) -> StagedAttention:
        """Return the capturable form: every layout is one run through the kernel, no split."""
        from lingbot_map_ros.engine.attention.staged import RunKernelAttention
        return RunKernelAttention(self.kernel, page_size, full_patch_pages, num_special_tokens,
                                  device)

    def plan(self, layout: PageLayout, num_queries: int) -> None:
        """Nothing to plan: ``run`` points the bounds at the layout's run."""

    def run(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
            layout: PageLayout) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the visible tokens of ``k_pages, v_pages: [N, T, H, D]``.

        Returns:
            ``[Q, H, D]`` in the dtype of ``q``.
        """
        heads, dim = k_pages.shape[2], k_pages.shape[3]
        if layout.first_page >= 0:
            k, v = k_pages.view(-1, heads, dim), v_pages.view(-1, heads, dim)
            start = layout.first_page * layout.page_size
            bounds = (start, start + layout.num_tokens)
        else:
            k, v = self._gather(k_pages, layout), self._gather(v_pages, layout)
            bounds = (0, layout.num_tokens)
        if bounds != self._host_bounds:
            self._bounds.copy_(torch.tensor(bounds, dtype=torch.int32))
            self._host_bounds = bounds
        dtype = attention_dtype(q, k_pages)
        return self.kernel(q if q.dtype == dtype else q.to(dtype), k, v, self._bounds)
