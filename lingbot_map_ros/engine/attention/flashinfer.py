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
"""FlashInfer backend: ``BatchPrefillWithPagedKVCacheWrapper`` over the NHD page pools.

The only module that imports ``flashinfer`` (lazily, when the backend is built). Shapes: ``Q``
queries, ``H`` heads, ``D`` head dim, ``N`` pages, ``T`` tokens per page.

One wrapper serves every layer: all layers share one page layout, so ``plan`` runs once per
layout (once per frame), and ``run`` once per layer with that layer's ``(k_pages, v_pages)``.
Host work per plan is kept small:

* the page-index tensor lives on the device for the whole session and is rewritten only when
  the visible pages change. A contiguous layout is sent as the physical range
  ``first_page .. first_page + n - 1`` (order does not matter to softmax; the partly filled
  page is the highest), so in steady state the indices change only when a special page is added;
* the rewrite goes through two pinned host buffers used in turn, with a CUDA event guarding each
  against reuse before its copy has run, so no copy waits for the GPU;
* ``qo_indptr``, ``kv_indptr`` and ``last_page_len`` stay on the host, where ``plan`` needs them.

Attention is non-causal, with no positional encoding in the kernel (RoPE is applied before the
cache) and FlashInfer's default scale ``1/sqrt(D)``. Queries are cast to the storage dtype.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.attention.page_layout import PageLayout

WORKSPACE_BYTES = 128 * 2**20
"""FlashInfer's recommended float workspace for split-kv partial results."""


def import_flashinfer() -> Any:
    """Import flashinfer, or raise ImportError saying how to install it.

    Raises:
        ImportError: flashinfer is not installed.
    """
    try:
        import flashinfer
    except ImportError as exc:
        raise ImportError(
            "attention backend 'flashinfer' needs FlashInfer (CUDA only): pip install "
            'flashinfer-python (see https://docs.flashinfer.ai/installation.html); '
            "or choose backend 'sdpa'") from exc
    return flashinfer


class FlashInferBackend:
    """FlashInfer paged prefill attention, planned once per layout.

    Args:
        num_heads: Heads ``H`` (queries and keys).
        head_dim: Head dim ``D``.
        page_size: Tokens per page ``T``.
        num_pages: Pages per layer pool.
        dtype: Storage dtype (bfloat16 or float16).
        device: CUDA device of the pools.
        kernel: FlashInfer kernel family: 'fa2', 'fa3' or 'auto'.

    Raises:
        ImportError: flashinfer is not installed.
    """

    name = 'flashinfer'
    graph_support = 'segments'  # plan() is host work per layout: eager between segments
    fallbacks = 0  # one kernel, nothing to step down to

    def __init__(self, *, num_heads: int, head_dim: int, page_size: int, num_pages: int,
                 dtype: torch.dtype, device: torch.device, kernel: str = 'fa2') -> None:
        flashinfer = import_flashinfer()
        self._num_heads = num_heads
        self._head_dim = head_dim
        self._page_size = page_size
        self._dtype = dtype
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, 'NHD', backend=kernel)
        self._indices = torch.empty(num_pages, dtype=torch.int32, device=device)
        self._staging = [torch.empty(num_pages, dtype=torch.int32, pin_memory=True)
                         for _ in range(2)]
        self._staging_done: list[torch.cuda.Event | None] = [None, None]
        self._next_staging = 0
        self._uploaded: tuple[int, ...] | range | None = None
        self._planned: tuple[int, int] | None = None
        self.num_plans = 0
        """Kernel plans made so far (one per new page layout or query count)."""

    def staged_attention(self, *args: object) -> None:
        """Return None: ``plan`` is host work, so segments only, never staged."""
        return None

    def plan(self, layout: PageLayout, num_queries: int) -> None:
        """Plan the kernel for ``layout`` and ``num_queries`` (no-op if already planned)."""
        key = (layout.version, num_queries)
        if key == self._planned:
            return
        if layout.first_page >= 0:
            pages: tuple[int, ...] | range = range(layout.first_page,
                                                   layout.first_page + layout.num_pages)
        else:
            pages = layout.page_ids
        if pages != self._uploaded:
            self._upload(pages)
        num_pages = layout.num_pages
        self._wrapper.plan(
            torch.tensor([0, num_queries], dtype=torch.int32),
            torch.tensor([0, num_pages], dtype=torch.int32),
            self._indices[:num_pages],
            torch.tensor([layout.last_page_len], dtype=torch.int32),
            self._num_heads, self._num_heads, self._head_dim, self._page_size,
            causal=False, pos_encoding_mode='NONE',
            q_data_type=self._dtype, kv_data_type=self._dtype)
        self._planned = key
        self.num_plans += 1

    def run(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
            layout: PageLayout) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the planned layout's pages of one layer.

        Returns:
            ``[Q, H, D]`` in the storage dtype.
        """
        if q.dtype != self._dtype:
            q = q.to(self._dtype)
        return self._wrapper.run(q, (k_pages, v_pages))

    def _upload(self, pages: tuple[int, ...] | range) -> None:
        slot = self._next_staging
        self._next_staging = 1 - slot
        done = self._staging_done[slot]
        if done is not None:
            # The copy that last read this buffer was queued two uploads ago: long finished
            # unless the host runs more than a frame ahead of the GPU.
            done.synchronize()
        staging = self._staging[slot]
        if isinstance(pages, range):
            torch.arange(pages.start, pages.stop, dtype=torch.int32, out=staging[:len(pages)])
        else:
            staging[:len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self._indices[:len(pages)].copy_(staging[:len(pages)], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._staging_done[slot] = event
        self._uploaded = pages
