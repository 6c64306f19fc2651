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
"""Attention over the paged KV cache: the backend protocol and ``make_backend``.

Shapes: ``Q`` query tokens, ``H`` heads, ``D`` head dim, ``N`` pages, ``T`` tokens per page.
A backend attends a frame's queries ``q: [Q, H, D]`` to the visible tokens of one layer's pool
``k_pages, v_pages: [N, T, H, D]`` described by a ``PageLayout``, with no mask and the default
scale ``1/sqrt(D)``. Key order does not matter (softmax is order-independent).

The cache calls ``plan`` once per layout (once per frame: every layer shares the page structure)
and ``run`` once per layer. Backends:

* ``flashinfer``: FlashInfer's paged prefill kernel (CUDA, bf16/fp16 storage only);
* ``sdpa``: torch SDPA on a strided view of the contiguous visible run (no gather), any device
  and dtype; it gathers the visible pages only for a layout that is not contiguous;
* ``triton``: our Triton kernel over the contiguous run, its bounds on the device (CUDA,
  bf16/fp16 attention, bf16/fp16/FP8 storage; ``triton_backend.py``);
* ``fa3``: the ``triton`` backend's handling with FlashAttention-3 as the kernel (Hopper;
  ``fa3.py``);
* ``reference``: gathers the visible pages, upcasts to float32 (float64 storage stays float64)
  and runs torch SDPA; the slow, simple check of the others.

A backend owns its capturable form: with ``graph_support == 'whole_frame'`` its
``staged_attention`` hands out a ``StagedAttention`` subclass (``staged.py``) whose hooks
(``attend_device``, ``full_window_key``, ``warm_up``) run its own kernels on the frame's
device-side numbers; the staged cache and the graph runner call those hooks and nothing
backend-specific. A backend that steps down to a slower kernel of its own counts it in
``fallbacks`` (the fast path reports it as the ``attention_kernel`` fallback).
"""

from __future__ import annotations

from typing import Literal, Protocol, TYPE_CHECKING

from lingbot_map_ros.engine.attention.fp8 import FP8_KV_DTYPES
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.attention.page_layout import PageLayout
    from lingbot_map_ros.engine.attention.staged import StagedAttention
    from lingbot_map_ros.kernel_config import KernelConfig

BACKEND_NAMES = ('flashinfer', 'sdpa', 'reference', 'triton', 'fa3', 'auto')
"""``auto``: ``triton`` where it runs, else ``sdpa`` (``backend_choice.py``; the cache resolves
it)."""

GraphSupport = Literal['segments', 'whole_frame']
"""What a backend's attention allows inside CUDA graphs: 'whole_frame' (its attention can be
captured with the rest of the frame: ``cache/staged_frames.py``), 'segments' (it runs eagerly
between captured segments: host work per layout)."""


class AttentionBackend(Protocol):
    """Attention of one frame's queries over one layer's visible pages."""

    name: str
    """'flashinfer', 'sdpa', 'reference', 'triton' or 'fa3'."""

    graph_support: GraphSupport
    """How far a streaming frame that uses this backend can be captured as CUDA graphs."""

    fallbacks: int
    """Times the backend stepped down to a slower kernel (the fast path's
    ``attention_kernel`` fallbacks)."""

    def staged_attention(self, page_size: int, full_patch_pages: int, num_special_tokens: int,
                         device: torch.device, compile_merge: bool) -> StagedAttention | None:
        """Return this backend's capturable form (``staged.py``), or None ('segments' only).

        With 'whole_frame' support the backend supplies the attention that a whole-frame CUDA
        graph captures: a ``StagedAttention`` subclass with its own kernels behind the hooks,
        reading the frame's numbers on the device (SGLang's per-backend capture hooks).
        ``compile_merge``: the form may ``torch.compile`` its small ops; others as
        ``StagedAttention``. None from a 'whole_frame' backend is a refusal: the fast path
        counts it (``backend_refused``) and runs segments.
        """

    def plan(self, layout: PageLayout, num_queries: int) -> None:
        """Prepare for ``run`` on ``layout``; cheap when called again with the same layout."""

    def run(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
            layout: PageLayout) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the visible tokens; returns ``[Q, H, D]``."""


def check_storage_dtype(storage: torch.dtype | None, dtype: torch.dtype,
                        backend: str) -> torch.dtype:
    """Return the K/V storage dtype of a cache attending in ``dtype`` (``None``: ``dtype``).

    Raises:
        ValueError: a storage dtype other than ``dtype`` or FP8 e4m3, or FP8 with a backend
            that cannot widen it on read.
    """
    if storage is None or storage == dtype:
        return dtype
    if storage not in FP8_KV_DTYPES:
        raise ValueError(f'KV storage dtype {storage} must be the attention dtype {dtype} or '
                         'torch.float8_e4m3fn')
    if backend == 'flashinfer':
        raise ValueError('FP8 KV storage (cache.dtype: float8_e4m3fn) is not wired to backend '
                         "'flashinfer'; use backend 'sdpa' (it widens FP8 on read) or 'triton'")
    return storage


def make_backend(name: str, *, num_heads: int, head_dim: int, page_size: int, num_pages: int,
                 dtype: torch.dtype, device: torch.device,
                 full_patch_pages: int = 0, precision: str = 'faithful',
                 kernel: KernelConfig | None = None) -> AttentionBackend:
    """Build the named backend for pools of ``num_pages`` pages ``[T, H, D]`` in ``dtype``.

    Args:
        name: 'flashinfer', 'sdpa', 'reference', 'triton' or 'fa3' ('auto' is resolved by the
            pool first, ``backend_choice.py``).
        num_heads: Heads ``H``.
        head_dim: Head dim ``D``.
        page_size: Tokens per page ``T``.
        num_pages: Pages per layer pool.
        dtype: Storage dtype of the pools.
        device: Device of the pools.
        full_patch_pages: Patch pages of a frame once the window is full (N_s + W); 'sdpa'
            splits its CUDA attention only from then on (see ``attention/split.py``).
        precision: ``cache.precision`` ('faithful' or 'fast_approximate'): the products our
            Triton kernel runs for FP8 keys (``backend_choice.py``).
        kernel: ``cache.kernel``, the tuning of the 'triton' and 'fa3' kernels (None: the
            defaults).

    Returns:
        The backend.

    Raises:
        ValueError: unknown name, or FlashInfer / Triton asked for on a non-CUDA device or a
            dtype other than bfloat16/float16.
        ImportError: 'flashinfer' or 'triton' asked for and its package is not installed.
    """
    if name == 'sdpa':
        from lingbot_map_ros.engine.attention.sdpa import SdpaBackend
        return SdpaBackend(full_patch_pages)
    if name == 'reference':
        from lingbot_map_ros.engine.attention.sdpa import ReferenceBackend
        return ReferenceBackend()
    if name == 'triton':
        if device.type != 'cuda' or dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"backend='triton' needs a CUDA device and bfloat16/float16 "
                             f'attention, got device={device}, dtype={dtype}; use '
                             "backend='sdpa' or 'reference'")
        from lingbot_map_ros.engine.attention.triton_backend import TritonBackend
        return TritonBackend(device, precision=precision, config=kernel)
    if name == 'fa3':  # FlashAttention-3 (fa3-fwd) as the run kernel: attention/fa3.py
        from lingbot_map_ros.engine.attention.fa3 import Fa3Backend
        return Fa3Backend(device, config=kernel)
    if name == 'flashinfer':
        if device.type != 'cuda':
            raise ValueError(f"backend='flashinfer' needs a CUDA device, got device={device}; "
                             "use backend='sdpa' or 'reference'")
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"backend='flashinfer' stores bfloat16 or float16, got dtype={dtype}"
                             "; use backend='sdpa' or 'reference' (force_fp32) for float32")
        from lingbot_map_ros.engine.attention.flashinfer import FlashInferBackend
        return FlashInferBackend(num_heads=num_heads, head_dim=head_dim, page_size=page_size,
                                 num_pages=num_pages, dtype=dtype, device=device)
    raise ValueError(f"attention backend '{name}' is not one of {', '.join(BACKEND_NAMES)}")
