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
"""The torch SDPA backends of the paged cache: ``sdpa`` (fast path) and ``reference`` (checks).

Shapes: ``Q`` queries, ``K`` visible keys, ``H`` heads, ``D`` head dim, ``N`` pages, ``T`` tokens
per page. Pools are ``[N, T, H, D]`` (NHD), so ``pool.view(N*T, H, D)[a:b]`` is a range of
tokens and ``.unsqueeze(0).transpose(1, 2)`` is the ``[1, H, K, D]`` view SDPA takes, with no
copy. The page table keeps every frame's visible tokens in one such range, so ``sdpa`` reads
the cache in place; it falls back to a gather only for a layout that is not contiguous.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lingbot_map_ros.engine.attention.fp8 import attention_dtype, widen
from lingbot_map_ros.engine.attention.page_gather import attend_tokens, PageGather
from lingbot_map_ros.engine.attention.sdpa_staged import SdpaStagedAttention
from lingbot_map_ros.engine.attention.split import SplitAttention
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.attention.page_layout import PageLayout
    from lingbot_map_ros.engine.attention.staged import StagedAttention


class SdpaBackend:
    """torch SDPA straight on the pool when the visible tokens are one range; any device.

    Queries are cast to the storage dtype; the output is in the storage dtype. An FP8 pool
    is widened to the queries' dtype on read (``fp8.py``), and the output is in that dtype.
    """

    name = 'sdpa'
    graph_support = 'whole_frame'  # its split attention has a staged, capturable form

    def __init__(self, full_patch_pages: int = 0) -> None:
        """Set up the gather fallback and the CUDA split.

        Args:
            full_patch_pages: patch pages once the window is full (N_s + W). The cuDNN/flash
                split (``split.py``) starts there: cuDNN plans each new key count once, and
                while the window fills every frame brings a new one, so a split during the
                fill would plan on every frame (docs/performance.md, 'cuDNN plans').
        """
        self._gather = PageGather()
        self._split = SplitAttention()
        self._split_from = max(1, full_patch_pages)
        self._split_prepared = False  # a backend serves one cache: one page size, one q shape

    @property
    def split(self) -> SplitAttention:
        """Return the cuDNN + flash attention (shared with staged frames: one switch for both)."""
        return self._split

    @property
    def fallbacks(self) -> int:
        """Return how often the split stepped down to plain SDPA."""
        return self._split.fallbacks

    def staged_attention(self, page_size: int, full_patch_pages: int, num_special_tokens: int,
                         device: torch.device, compile_merge: bool) -> StagedAttention:
        """Return the capturable form: flash varlen over a device-side range, and the split."""
        return SdpaStagedAttention(self._split, page_size, full_patch_pages,
                                   num_special_tokens, device, compile_merge)

    def plan(self, layout: PageLayout, num_queries: int) -> None:
        """Nothing to plan: the kernel reads the layout's token range directly."""

    def run(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
            layout: PageLayout) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the visible tokens of ``k_pages, v_pages: [N, T, H, D]``.

        Returns:
            ``[Q, H, D]`` in the storage dtype (the queries' dtype for an FP8 pool).
        """
        dtype = attention_dtype(q, k_pages)
        if q.dtype != dtype:
            q = q.to(dtype)
        if layout.first_page >= 0:
            start = layout.first_page * layout.page_size
            stop = start + layout.num_tokens
            num_heads, head_dim = k_pages.shape[2], k_pages.shape[3]
            all_k = k_pages.view(-1, num_heads, head_dim)
            all_v = v_pages.view(-1, num_heads, head_dim)
            k, v = widen(all_k[start:stop], dtype), widen(all_v[start:stop], dtype)
            # In a contiguous layout the patch pages come first, then the special stream.
            patch_pages = layout.num_scale_pages + layout.num_window_pages
            patches = patch_pages * layout.page_size
            if not self._split_prepared:
                # Keyframes of a full window, and non-keyframes (one page more) from one frame
                # before it fills: plan both now rather than mid-stream.
                counts = (self._split_from * layout.page_size,
                          (self._split_from + 1) * layout.page_size)
                self._split.prepare(q, widen(all_k[:counts[1]], dtype),
                                    widen(all_v[:counts[1]], dtype), counts)
                self._split_prepared = True
            if patch_pages >= self._split_from \
                    and self._split.usable(q, patches, layout.num_tokens):
                out = self._split(q, k, v, patches)
                if out is not None:
                    return out
        else:
            k = widen(self._gather(k_pages, layout), dtype)
            v = widen(self._gather(v_pages, layout), dtype)
        return attend_tokens(q, k, v)


class ReferenceBackend:
    """Gather the visible pages, upcast to float32 (float64 stays float64), torch SDPA.

    The output is in that compute dtype.
    """

    name = 'reference'
    graph_support = 'segments'  # per-layout gather index: host work between segments
    fallbacks = 0  # one kernel, nothing to step down to

    def __init__(self) -> None:
        self._gather = PageGather()

    def staged_attention(self, *args: object) -> None:
        """Return None: segments only, never staged."""
        return None

    def plan(self, layout: PageLayout, num_queries: int) -> None:
        """Nothing to plan; the gather index is built on the first ``run`` of a layout."""

    def run(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
            layout: PageLayout) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the gathered visible tokens.

        Returns:
            ``[Q, H, D]`` in float32, or float64 when the pool is float64.
        """
        dtype = torch.float64 if k_pages.dtype == torch.float64 else torch.float32
        k = self._gather(k_pages, layout).to(dtype)
        v = self._gather(v_pages, layout).to(dtype)
        return attend_tokens(q.to(dtype), k, v)
