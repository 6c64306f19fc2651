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
"""Cache attention whose per-frame numbers live on the device: a whole frame in one CUDA graph.

Shapes: ``Q`` queries, ``H`` heads, ``D`` head dim, ``T`` tokens per page; a layer's pool is
``[N, T, H, D]``, read here as its flat token view ``[N*T, H, D]``.

Why: with the fixed-shape parts of a frame replayed as CUDA graphs, the 24 cache attentions
between them would still be issued one by one from Python, each with its page bookkeeping. What
changes from frame to frame in that attention is only *where* the visible keys are: the run
``[start, stop)`` of the flat pool (the page table keeps it one contiguous range,
``page_table.py``) and the slots the frame's keys are written to. Kept in small device tensors,
they let one captured graph serve every frame of a kind (model/graphed.py). On the H200 that
saves ~0.7 ms of the aggregator's ~26 ms per frame and up to ~3.5 ms on window-fill frames
(bench/results/h200_whole_frame/):

* ``range``: one flash varlen call whose key range is ``cu_seqlens_k = [start, stop]`` read on
  the device (flash takes the keys of "sequence 0" from offset ``cu_seqlens_k[0]``). Any
  layout; the window-fill phase uses it;
* ``split``: once the window is full the patch run has one of two fixed places (keyframe: the
  ``N_s + W`` pages above the spare one; non-keyframe: those plus the spare page), so cuDNN
  runs it at a fixed shape (~1.75x the flash kernel's speed, ``split.py``) and the special
  stream, which grows by 6 keys per keyframe, goes to flash varlen over
  ``[R*T, stop)``. The two are merged by log-sum-exp.

With backend ``triton`` (``run_kernel`` given) every layout is ``range``: the Triton kernel
reads ``[start, stop)`` from the device itself, FP8 pools included, with no split.

On the CPU (tests, no capture) ``range`` reads the numbers on the host and runs SDPA.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from lingbot_map_ros.engine.attention.fp8 import attention_dtype, widen
from lingbot_map_ros.engine.attention.sdpa import attend_tokens
from lingbot_map_ros.engine.attention.split import cudnn_part, merge_partial, SplitAttention
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.cache.page_table import PageLayout

StagedKey = tuple
"""What a captured graph is specialised on: ``('range',)`` or ``('split', start, patches)``."""


def _flash_range(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                 cu_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash varlen over keys ``k[cu_k[0]:cu_k[1]]``, the bounds read on the device.

    Returns:
        ``([Q, H, D], [H, Q])``: output and natural log-sum-exp.
    """
    num_q, heads = q.shape[0], q.shape[1]
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, num_q, k.shape[0], 0.0, False, False)
    return out, lse.reshape(heads, num_q)


class StagedAttention:
    """The visible range of the frame in flight as device numbers, and attention over it.

    The stream whose frame is staged gives its special stream's first token (``special_base``:
    its lease's first page + ``R = N_s + W + 1`` patch pages, times ``T``) with every layout.

    Args:
        split: the backend's cuDNN/flash split (shared: one switch turns cuDNN off), or None
            (a backend without one: every layout is ``range``).
        page_size: ``T``.
        full_patch_pages: ``N_s + W``: from this many visible patch pages on, ``split``.
        num_special_tokens: ``S`` specials per frame.
        device: device of the pools.
        compile_merge: ``torch.compile`` the log-sum-exp merge (one fused kernel, not ~12).
        run_kernel: attention over a device-side run ``(q, k, v, bounds)`` (backend
            ``triton``); None: flash varlen / cuDNN split.
    """

    def __init__(self, split: SplitAttention | None, page_size: int, full_patch_pages: int,
                 num_special_tokens: int, device: torch.device, compile_merge: bool = False,
                 run_kernel: Any = None) -> None:
        self._split = split
        self._run_kernel = run_kernel
        self._num_special = num_special_tokens
        self._page_size = page_size
        self._special_base = -1
        self._full_patch_pages = full_patch_pages
        # [start, stop, special_base, stop]: rows [0:2] and [2:4] are the cu_seqlens_k of the
        # whole range and of the special stream, as views (no per-call indexing kernel).
        self._bounds = torch.zeros(4, dtype=torch.int32, device=device)
        self._host_bounds = (0, 0)
        self._cu_q: torch.Tensor | None = None  # [0, Q]; built before any capture
        self._cu_q_len = -1
        self._merge = torch.compile(merge_partial, dynamic=False, fullgraph=True) \
            if compile_merge else merge_partial

    def warm_up(self, q: torch.Tensor, k_pages: torch.Tensor | None = None,
                v_pages: torch.Tensor | None = None) -> None:
        """Compile the merge, or the run kernel over ``k_pages, v_pages``, for ``q`` now.

        Queries are shaped like ``q: [Q, H, D]``; done outside any capture, so that a failure
        shows here.
        """
        if self._merge is not merge_partial and q.is_cuda:
            lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
            self._merge(q, lse, q, lse)
        if self._run_kernel is not None and q.is_cuda and k_pages is not None \
                and v_pages is not None:
            heads, dim = k_pages.shape[2], k_pages.shape[3]
            bounds = torch.tensor([0, self._page_size], dtype=torch.int32, device=q.device)
            self._run_kernel(q, k_pages.view(-1, heads, dim), v_pages.view(-1, heads, dim),
                             bounds)
        self._queries(q)

    def set(self, layout: PageLayout,  # noqa: A003 - a method, not the builtin
            special_base: int) -> StagedKey:
        """Point the device numbers at ``layout``'s visible run; returns the graph key.

        Raises:
            ValueError: the layout's tokens are not one contiguous range.
        """
        if not layout.is_contiguous:
            raise ValueError('staged attention needs a contiguous visible run')
        start = layout.first_page * self._page_size
        self._point_at(start, start + layout.num_tokens, special_base)
        return self.key_for(layout, special_base)

    def set_placeholder(self, keyframe: bool, first_page: int, special_base: int) -> StagedKey:
        """Point the numbers at a full-window layout (for capturing its graph ahead of time).

        The run is the keyframe's (``N_s + W`` pages above the spare one, the stream's
        ``first_page``) or the non-keyframe's (with the spare page), plus one frame of specials.

        Returns:
            The ``split`` key of that layout, or ``('range',)`` where the split is off.
        """
        start = (first_page + (1 if keyframe else 0)) * self._page_size
        self._point_at(start, special_base + self._num_special, special_base)
        if not self._split_on():
            return ('range',)
        return ('split', start, special_base - start)

    def _split_on(self) -> bool:
        return self._split is not None and self._split.enabled and self._bounds.is_cuda \
            and self._run_kernel is None

    def _point_at(self, start: int, stop: int, special_base: int) -> None:
        # Fill kernels, stream-ordered after the previous frame's replay; no host sync.
        self._bounds[0].fill_(start)
        self._bounds[1].fill_(stop)
        self._bounds[3].fill_(stop)
        if special_base != self._special_base:  # changes only with the stream's lease
            self._bounds[2].fill_(special_base)
            self._special_base = special_base
        self._host_bounds = (start, stop)

    def key_for(self, layout: PageLayout, special_base: int) -> StagedKey:
        """Return the graph key of a layout (see the module docstring)."""
        patch_pages = layout.num_scale_pages + layout.num_window_pages
        start = layout.first_page * self._page_size
        patches = patch_pages * self._page_size
        if patch_pages >= self._full_patch_pages and self._split_on() \
                and start + patches == special_base:
            return ('split', start, patches)
        return ('range',)

    def attend(self, key: StagedKey, q: torch.Tensor, k_pages: torch.Tensor,
               v_pages: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the staged run of ``k_pages, v_pages: [N, T, H, D]``.

        Returns:
            ``[Q, H, D]`` in the storage dtype (the queries' dtype for an FP8 pool).
        """
        dtype = attention_dtype(q, k_pages)
        if q.dtype != dtype:
            q = q.to(dtype)
        heads, dim = k_pages.shape[2], k_pages.shape[3]
        if self._run_kernel is not None and q.is_cuda:
            return self._run_kernel(q, k_pages.view(-1, heads, dim),
                                    v_pages.view(-1, heads, dim), self._bounds[0:2])
        # An FP8 pool is widened whole (a fixed shape, so the graph stays one graph).
        k = widen(k_pages.view(-1, heads, dim), dtype)
        v = widen(v_pages.view(-1, heads, dim), dtype)
        if not q.is_cuda:
            start, stop = self._host_bounds
            return attend_tokens(q, k[start:stop], v[start:stop])
        cu_q = self._queries(q)
        if key[0] == 'range':
            return _flash_range(q, k, v, cu_q, self._bounds[0:2])[0]
        _, start, patches = key
        o1, lse1 = cudnn_part(q, k[start:start + patches], v[start:start + patches])
        o2, lse2 = _flash_range(q, k, v, cu_q, self._bounds[2:4])
        return self._merge(o1, lse1, o2, lse2)

    def _queries(self, q: torch.Tensor) -> torch.Tensor:
        if self._cu_q is None or self._cu_q_len != q.shape[0]:
            self._cu_q = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
            self._cu_q_len = q.shape[0]
        return self._cu_q
