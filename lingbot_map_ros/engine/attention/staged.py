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
they let one captured graph serve every frame of a kind (runner/whole_batch.py), which saves the
host's launches and bookkeeping of those attentions on every frame, most on window-fill frames
(docs/performance.md, 'Whole-frame graphs').

:class:`StagedAttention` holds those numbers and the graph keys; it is the base of each
whole-frame backend's capturable form (SGLang's per-backend capture hooks), which a backend
hands out from ``AttentionBackend.staged_attention``. A form supplies :meth:`attend_device`
(its kernels, reading the device numbers) and may specialise the full-window frames, whose
patch run has one of two fixed places, with keys of its own (:meth:`full_window_key`) and
prepare its kernels outside any capture (:meth:`warm_up`):

* :class:`RunKernelAttention` (backends ``triton``, ``fa3``): a kernel that reads
  ``[start, stop)`` from the device itself, FP8 pools included; one key, ``('range',)``;
* ``SdpaStagedAttention`` (``sdpa_staged.py``, backend ``sdpa``): flash varlen over the range,
  and cuDNN + flash with a log-sum-exp merge once the window is full.

On the CPU (tests, no capture) every form reads the numbers on the host and runs SDPA.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from lingbot_map_ros.engine.attention.fp8 import attention_dtype, widen
from lingbot_map_ros.engine.attention.page_gather import attend_tokens
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.attention.page_layout import PageLayout

StagedKey = tuple
"""What a captured graph is specialised on: ``('range',)`` or ``('split', start, patches)``."""


def token_operands(q: torch.Tensor, k_pages: torch.Tensor,
                   v_pages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``q`` in the attention dtype and the pools' flat token views ``[N*T, H, D]``."""
    dtype = attention_dtype(q, k_pages)
    heads, dim = k_pages.shape[2], k_pages.shape[3]
    return (q if q.dtype == dtype else q.to(dtype), k_pages.view(-1, heads, dim),
            v_pages.view(-1, heads, dim))


class StagedAttention:
    """The visible range of the frame in flight as device numbers; a backend's form attends.

    The stream whose frame is staged gives its special stream's first token (``special_base``:
    its lease's first page + ``R = N_s + W + 1`` patch pages, times ``T``) with every layout.

    Args:
        page_size: ``T``.
        full_patch_pages: ``N_s + W``: from this many visible patch pages on, a frame's patch
            run has a fixed place (:meth:`full_window_key`).
        num_special_tokens: ``S`` specials per frame.
        device: device of the pools.
    """

    def __init__(self, page_size: int, full_patch_pages: int, num_special_tokens: int,
                 device: torch.device) -> None:
        self._num_special = num_special_tokens
        self._page_size = page_size
        self._special_base = -1
        self._full_patch_pages = full_patch_pages
        # [start, stop, special_base, stop]: rows [0:2] and [2:4] are the bounds of the whole
        # range and of the special stream, as views (no per-call indexing kernel).
        self._bounds = torch.zeros(4, dtype=torch.int32, device=device)
        self._host_bounds = (0, 0)

    # ---- hooks of a backend's form -----------------------------------------------------------

    def warm_up(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor) -> None:
        """Build, compile or plan the form's kernels for ``q: [Q, H, D]`` over these pools.

        Called outside any capture, so that a failure shows there; nothing to do by default.
        """

    def full_window_key(self, start: int, patches: int) -> StagedKey:
        """Return the graph key of a full-window run: ``patches`` tokens from ``start``.

        Then the special stream follows the patches directly. A form that runs such frames
        with other kernels returns a key of its own; by default one graph serves all.
        """
        return ('range',)

    def joint_kernel(self) -> Any:
        """Return a kernel over several frames' runs at once, or None (``cache/staged_runs``).

        ``(q: [B, Q, H, D], k, v: [N*T, H, D], bounds: [B, >= 2]) -> [B, Q, H, D]``; none by
        default.
        """
        return None

    @property
    def run_bounds(self) -> torch.Tensor:
        """Return the staged run's ``[start, stop]`` on the device (a view, updated per frame)."""
        return self._bounds[0:2]

    def attend_device(self, key: StagedKey, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` (CUDA) to the staged run of the token views ``k, v``.

        ``k, v: [N*T, H, D]`` in the storage dtype; ``q`` in the attention dtype. Capturable:
        the run's bounds are read from the device numbers.
        """
        raise NotImplementedError(f'{type(self).__name__} has no device attention')

    # ---- the numbers ---------------------------------------------------------------------------

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
            That layout's key (:meth:`full_window_key`).
        """
        start = (first_page + (1 if keyframe else 0)) * self._page_size
        self._point_at(start, special_base + self._num_special, special_base)
        return self.full_window_key(start, special_base - start)

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
        if patch_pages >= self._full_patch_pages and start + patches == special_base:
            return self.full_window_key(start, patches)
        return ('range',)

    def attend(self, key: StagedKey, q: torch.Tensor, k_pages: torch.Tensor,
               v_pages: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the staged run of ``k_pages, v_pages: [N, T, H, D]``.

        Returns:
            ``[Q, H, D]`` in the storage dtype (the queries' dtype for an FP8 pool).
        """
        q, k, v = token_operands(q, k_pages, v_pages)
        dtype = q.dtype
        if q.is_cuda:
            return self.attend_device(key, q, k, v)
        start, stop = self._host_bounds
        return attend_tokens(q, widen(k[start:stop], dtype), widen(v[start:stop], dtype))


class RunKernelAttention(StagedAttention):
    """The capturable form of a kernel that reads the run's bounds from the device.

    Backends ``triton`` and ``fa3``: ``run_kernel(q, k, v, bounds)`` attends to
    ``k[start:stop]`` with ``bounds = [start, stop]`` an int32 device tensor, FP8 pools read as
    they are; every layout is one range, one key.
    """

    def __init__(self, run_kernel: Any, page_size: int, full_patch_pages: int,
                 num_special_tokens: int, device: torch.device) -> None:
        """Keep ``run_kernel``; the numbers as :class:`StagedAttention`."""
        super().__init__(page_size, full_patch_pages, num_special_tokens, device)
        self._run_kernel = run_kernel

    def warm_up(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor) -> None:
        """Run the kernel once on one page (its compilation and autotuning happen here)."""
        if not q.is_cuda:
            return
        heads, dim = k_pages.shape[2], k_pages.shape[3]
        bounds = torch.tensor([0, self._page_size], dtype=torch.int32, device=q.device)
        self._run_kernel(q, k_pages.view(-1, heads, dim), v_pages.view(-1, heads, dim), bounds)

    def joint_kernel(self) -> Any:
        """Return the run kernel's ``attend_runs`` (backend ``fa3`` with parts), or None."""
        return getattr(self._run_kernel, 'attend_runs', None)

    def attend_device(self, key: StagedKey, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor) -> torch.Tensor:
        """Run the kernel over the staged range (the bounds stay on the device)."""
        return self._run_kernel(q, k, v, self._bounds[0:2])
