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

Its tiles, warps, pipelining depth and key parts are ``cache.kernel.triton_*``
(``KernelConfig``, by default the best of a sweep: docs/performance.md, 'Triton kernel
configuration'; ``bench/attention_kernels.py`` measures the candidates).
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from lingbot_map_ros.engine.attention.fp8 import attention_dtype
from lingbot_map_ros.engine.attention.page_gather import PageGather
from lingbot_map_ros.kernel_config import KernelConfig
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.attention.page_layout import PageLayout
    from lingbot_map_ros.engine.attention.staged import StagedAttention


def triton_kernel_args(kernel: KernelConfig, precision: str = 'faithful') -> dict[str, Any]:
    """Return the keyword arguments of ``attend_run`` that ``kernel`` and ``precision`` set.

    ``triton_qk`` 'auto' carries the queries in two e4m3 terms under 'faithful' and in one
    under 'fast_approximate'; FP8 products run where the keys are FP8 and the GPU has them,
    unless 'widened'.
    """
    args: dict[str, Any] = {'block_m': kernel.triton_block_m, 'block_n': kernel.triton_block_n,
                            'num_warps': kernel.triton_num_warps,
                            'num_stages': kernel.triton_num_stages,
                            'splits': kernel.triton_splits}
    if kernel.triton_qk == 'widened':
        args['qk_fp8'] = False
    args['qk_split'] = {'split': True, 'single': False}.get(kernel.triton_qk,
                                                            precision == 'faithful')
    return args


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
        kernel: ``cache.kernel`` (None: the defaults).
    """

    def __init__(self, precision: str = 'faithful', kernel: KernelConfig | None = None) -> None:
        self._attend = import_triton_kernel()
        self.args = triton_kernel_args(kernel or KernelConfig(), precision)
        """The kernel's keyword arguments (tiles, warps, stages, key parts, QK products)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 bounds: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to ``k[start:stop]``, ``v[start:stop]`` (token views)."""
        return self._attend(q, k, v, bounds, **self.args)


class TritonBackend:
    """Backend ``triton``: the visible run's bounds go to the kernel as a device tensor."""

    name = 'triton'
    graph_support = 'whole_frame'  # the kernel reads the run's bounds from the device
    fallbacks = 0  # one kernel, nothing to step down to

    def __init__(self, device: torch.device, kernel: Any = None,
                 precision: str = 'faithful', config: KernelConfig | None = None) -> None:
        # Another kernel over a device-side run (``fa3.py``) reuses the rest as it is.
        self.kernel = kernel if kernel is not None else TritonRunAttention(precision, config)
        self._bounds = torch.zeros(2, dtype=torch.int32, device=device)
        self._host_bounds = (-1, -1)
        self._gather = PageGather()

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
