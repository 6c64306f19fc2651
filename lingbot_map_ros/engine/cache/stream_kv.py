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
"""StreamKV: one stream's KV cache on the engine's pool, planned a frame at a time.

Shapes: ``P = S + T`` tokens per frame (``S`` specials, ``T`` patches), ``H`` heads, ``D`` head
dim; ``k, v, q: [S*P, H, D]`` for a call of ``S`` frames.

The frame-level protocol (as vLLM plans a step once for all layers):

1. :meth:`StreamKV.plan_frame` makes the call's page-table steps once: one append per scale
   frame, or one append for a streaming frame (a keyframe with a full window evicts the oldest
   window frame and takes its page, so the sliding window is decided here, not read back). The
   plan holds where the call's tokens go (``index``, on the device) and what every layer then
   attends (``layout``);
2. every layer calls :meth:`write` and :meth:`attend` with that plan;
3. :meth:`end_frame` ends it: a non-keyframe is rolled back, so nothing of it stays.

The limits are checked before any table step (``CachePoolExhaustedError``), so a refused call
leaves the stream as it was. The stream holds a lease of the pool (``kv_pool.py``): its page
table works on pool page ids inside that lease only; ``release`` gives the pages back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .kv_pool import KVPool, PageLease
from .page_table import PageLayout, TableStep, TwoStreamPageTable
from ..errors import CachePoolExhaustedError, CacheStateError
from ..frames import Role


@dataclass(frozen=True)
class FramePlan:
    """One call's cache work, the same for every layer."""

    role: Role
    """'scale', 'keyframe' or 'non-keyframe'."""
    num_frames: int
    """Frames of the call (N_s for the scale pass, else 1)."""
    index: torch.Tensor
    """int64 ``[num_frames * P]``: the pool token each of the call's tokens is written to."""
    layout: PageLayout
    """What every layer's queries attend after the writes (scale pass: nothing, dense)."""
    special_base: int
    """Pool token index of the stream's special stream (staged attention's split point)."""


class OnPool:
    """What the model reads of any K/V target on a pool: its dtype, device and frame size."""

    pool: KVPool

    @property
    def dtype(self) -> torch.dtype:
        """Attention dtype of the K/V."""
        return self.pool.dtype

    @property
    def device(self) -> torch.device:
        """Device of the pages."""
        return self.pool.device

    @property
    def tokens_per_frame(self) -> int:
        """``P``."""
        return self.pool.tokens_per_frame


class StreamKV(OnPool):
    """A stream's page table over its lease of the engine's pool.

    Args:
        pool: The engine's pool (its page size is the stream's frame size).
        scale_frames: ``N_s``.
        sliding_window: ``W``.
        max_total_frames: Capacity of the stream's special stream, in frames.

    Raises:
        PoolExhaustedError: the pool has no room for the stream (nothing changed).
    """

    @classmethod
    def for_cache(cls, pool: KVPool, cache: Any) -> 'StreamKV':
        """Return a stream's table on ``pool`` sized by ``cache`` (a ``CacheConfig``)."""
        return cls(pool, cache.scale_frames, cache.sliding_window, cache.max_total_frames)

    def __init__(self, pool: KVPool, scale_frames: int, sliding_window: int,
                 max_total_frames: int) -> None:
        self.pool = pool
        self.scale_frames = scale_frames
        self.sliding_window = sliding_window
        self.max_total_frames = max_total_frames
        self.stream_id = pool.new_stream_id()
        pages = stream_pages(pool.page_size, pool.num_special_tokens, scale_frames,
                             sliding_window, max_total_frames)
        self._lease: PageLease | None = pool.lease(self.stream_id, pages)
        self.table = TwoStreamPageTable(pool.page_size, pool.num_special_tokens, scale_frames,
                                        sliding_window, max_total_frames,
                                        first_page=self._lease.first_page,
                                        versions=pool.versions)
        self._plan: FramePlan | None = None

    # ---- what the model reads -------------------------------------------------------------

    @property
    def lease(self) -> PageLease | None:
        """Return the pool pages the stream holds; None once released."""
        return self._lease

    @property
    def num_frames(self) -> int:
        """Frames cached (scale frames and keyframes)."""
        return self.table.num_frames

    def remaining_frames(self) -> int:
        """Keyframes that still fit in the special stream."""
        return self.table.remaining_frames()

    # ---- the frame protocol ---------------------------------------------------------------

    def planning(self, role: Role, num_frames: int = 1
                 ) -> tuple[Callable[[], FramePlan], Callable[[FramePlan, bool], None]]:
        """Return this stream's ``(begin, end)`` of a call, for ``planned.planned``."""
        return (lambda: self.plan_frame(role, num_frames),
                lambda plan, failed: self.end_frame(plan, failed=failed))

    def plan_frame(self, role: Role, num_frames: int = 1) -> FramePlan:
        """Make a call's table steps for every layer at once (module docstring, step 1).

        Raises:
            CachePoolExhaustedError: the special stream has no room (nothing changed).
            CacheStateError: a plan in flight, a released stream, or a step that would move
                pages (never for this protocol's appends).
        """
        if self._plan is not None:
            raise CacheStateError('plan_frame while a frame is in flight; end_frame first')
        if self._lease is None:
            raise CacheStateError('plan_frame on a released stream')
        if self.remaining_frames() < num_frames:
            raise CachePoolExhaustedError(
                f'KV cache has room for {self.remaining_frames()} more frames, {num_frames} '
                f'needed (cache.max_total_frames={self.max_total_frames}); reset')
        keyframe = role != 'non-keyframe'
        steps = [self.table.append(keyframe) for _ in range(num_frames)]
        storage = self.pool.storage
        parts = [storage.frame_index(step.patch_page, step.special_start) for step in steps]
        for step in steps:
            _check_no_moves(step)
        index = parts[0] if len(parts) == 1 else torch.cat(parts)
        self._plan = FramePlan(role, num_frames, index, self.table.layout,
                               self.table.special_base)
        return self._plan

    def write(self, plan: FramePlan, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write layer ``layer``'s K and V of the planned call (``[num_frames * P, H, D]``)."""
        self.pool.storage.write(layer, plan.index, k, v)

    def attend(self, plan: FramePlan, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to layer ``layer``'s visible tokens of the plan.

        Returns:
            ``[Q, H, D]`` (the backend's dtype; may be a view).
        """
        backend, storage = self.pool.backend, self.pool.storage
        backend.plan(plan.layout, q.shape[0])
        return backend.run(q, storage.k[layer], storage.v[layer], plan.layout)

    def end_frame(self, plan: FramePlan, failed: bool = False) -> None:
        """End the planned call: a non-keyframe is rolled back (module docstring, step 3).

        Args:
            plan: The plan :meth:`plan_frame` returned.
            failed: The call raised part-way: its frames are rolled back (a keyframe that
                evicted the oldest window frame cannot bring it back; the stream goes on
                without it).

        Raises:
            CacheStateError: ``plan`` is not the one in flight.
        """
        if plan is not self._plan:
            raise CacheStateError('end_frame with a plan that is not in flight')
        self._plan = None
        undo = plan.num_frames if failed else int(plan.role == 'non-keyframe')
        for _ in range(undo):
            _check_no_moves(self.table.rollback())

    def reset(self) -> None:
        """Forget every frame; the lease stays."""
        self._plan = None
        self.table.reset()

    def release(self) -> None:
        """Forget every frame and give the lease back (the stream takes no frame after this).

        The counters still answer (an empty stream), so a status can show the reset.
        """
        if self._lease is not None:
            self.pool.release(self._lease)
            self._lease = None
        self.reset()

    def stats(self) -> dict[str, Any]:
        """Occupancy in ``FlashInferKVCacheManager.get_cache_stats``' keys, plus the pool's."""
        layout, table, storage = self.table.layout, self.table, self.pool.storage
        return cache_stats(layout, table, storage, self.pool)


def stream_pages(page_size: int, num_special_tokens: int, scale_frames: int,
                 sliding_window: int, max_total_frames: int) -> int:
    """Pages of one stream's lease: ``N_s + W + 1`` patch pages and its special pages."""
    patch = scale_frames + sliding_window + 1
    return patch + -(-max_total_frames * num_special_tokens // page_size)


def prep_pages(page_size: int, num_special_tokens: int, scale_frames: int) -> int:
    """Return the pool pages a prepared scale pass holds: N_s patch pages and their specials."""
    return scale_frames + -(-scale_frames * num_special_tokens // page_size)


def cache_stats(layout: PageLayout, table: TwoStreamPageTable, storage: Any,
                pool: KVPool) -> dict[str, Any]:
    """Return the counters of a table and layout (``get_cache_stats``' keys), pool included."""
    return {
        'frame_count': layout.num_frames,
        'scale_pages': layout.num_scale_pages,
        'live_pages': layout.num_window_pages,
        'free_pages': table.num_patch_pages - layout.num_scale_pages - layout.num_window_pages,
        'special_tokens': table.num_special_tokens * layout.num_frames,
        'special_pages': layout.num_special_pages,
        'free_special_pages': table.num_special_pages - layout.num_special_pages,
        'visible_tokens': layout.num_tokens,
        'contiguous': layout.is_contiguous,
        'page_size': table.page_size,
        'num_patch_pages': table.num_patch_pages,
        'num_special_pages': table.num_special_pages,
        'max_total_frames': table.max_total_frames,
        'remaining_frames': table.max_total_frames - layout.num_frames,
        'kv_bytes': storage.num_bytes,
        'kv_bytes_used': layout.num_pages * storage.bytes_per_page * storage.num_layers,
        'backend': pool.backend_name,
        'precision': pool.precision,
        'kernel': pool.kernel.summary(),
        'dtype': str(pool.storage_dtype).removeprefix('torch.'),
        'pool_pages_total': pool.num_pages,
        'pool_pages_free': pool.num_free,
        'pool_streams': pool.num_streams,
    }


def _check_no_moves(step: TableStep) -> None:
    if step.moves:
        raise CacheStateError(f'frame plan: {step.kind} would move pages {step.moves}; the '
                              'frame protocol makes only keyframe/non-keyframe appends')
