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
"""Staged frames: one streaming frame's cache work with its numbers on the device.

A whole streaming frame can be one CUDA graph (``runner/whole_batch.py``) only if the cache work
inside it needs no host decision. :meth:`StagedFrames.stage_frame` plans the frame on its stream
(``StreamKV.plan_frame``: every layer's writes and keys at once) and puts where the frame goes
and what it sees into device tensors; the graph then calls :meth:`~StagedFrames.write` and
:meth:`~StagedFrames.attend` per block; :meth:`~StagedFrames.finish` ends the frame. The device
numbers belong to the pool, not to a stream: one captured graph serves every stream whose run
has the same key. The attention is the pool's backend's own capturable form
(``AttentionBackend.staged_attention``, ``attention/staged.py``): this protocol knows no
backend. Only backends whose ``graph_support`` is 'whole_frame' (and, on CUDA, bf16/fp16
storage) can stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lingbot_map_ros.engine.attention.staged import StagedAttention, StagedKey
from lingbot_map_ros.engine.cache.kv_pool import KVPool
from lingbot_map_ros.engine.cache.stream_kv import FramePlan, StreamKV
from lingbot_map_ros.engine.errors import CacheStateError
import torch


def can_stage(pool: KVPool) -> bool:
    """Tell whether frames on ``pool`` can be staged.

    They can when its backend declares 'whole_frame' graph support and the attention dtype is
    bf16/fp16 on CUDA (any dtype elsewhere).
    """
    if pool.backend.graph_support != 'whole_frame':
        return False
    return pool.device.type != 'cuda' or pool.dtype in (torch.bfloat16, torch.float16)


class StagedFrames:
    """The staged-frame protocol over one pool; each frame is planned on its own stream."""

    def __init__(self, pool: KVPool, compile_merge: bool = False) -> None:
        """Build the device-side numbers.

        Args:
            pool: the pool whose storage the frames go through.
            compile_merge: let the backend's form ``torch.compile`` its small ops (the sdpa
                split's log-sum-exp merge).

        Raises:
            CacheStateError: the pool cannot stage (see :func:`can_stage`), or its backend
                supplies no capturable form (a refusal).
        """
        if not can_stage(pool):
            raise CacheStateError('staged frames need a whole-frame backend (sdpa, triton) '
                                  f'with bf16/fp16 on CUDA, not {pool.backend_name} with '
                                  f'{pool.dtype} on {pool.device}')
        self._pool = pool
        attention = pool.backend.staged_attention(pool.page_size, pool.full_patch_pages,
                                                  pool.num_special_tokens, pool.device,
                                                  compile_merge)
        if attention is None:
            raise CacheStateError(f'backend {pool.backend_name} declares whole-frame support '
                                  'but supplies no staged attention')
        self._attention: StagedAttention = attention
        self._index = torch.zeros(pool.tokens_per_frame, dtype=torch.long, device=pool.device)
        self._frame: tuple[StreamKV, FramePlan] | None = None

    @property
    def pool(self) -> KVPool:
        """Return the pool the frames go through."""
        return self._pool

    @property
    def index(self) -> torch.Tensor:
        """Return the staged frame's destination tokens ``[P]`` (a device buffer, updated)."""
        return self._index

    @property
    def bounds(self) -> torch.Tensor:
        """Return the staged run's ``[start, stop]`` (a device buffer, updated)."""
        return self._attention.run_bounds

    def joint_kernel(self) -> Any:
        """Return the form's kernel over several slots' runs at once, or None (``staged_runs``)."""
        return self._attention.joint_kernel()

    def warm_up(self, q: torch.Tensor) -> None:
        """Prepare the backend's form for queries shaped like ``q: [Q, H, D]`` now."""
        storage = self._pool.storage
        self._attention.warm_up(q, storage.k[0], storage.v[0])

    def staging(self, kv: StreamKV, keyframe: bool
                ) -> tuple[Callable[[], StagedKey], Callable[[StagedKey, bool], None]]:
        """Return ``(begin, end)`` of staging ``kv``'s frame here, for ``planned.planned``."""
        return (lambda: self.stage_frame(kv, keyframe),
                lambda _key, failed: self.finish(failed=failed))

    def stage_frame(self, kv: StreamKV, keyframe: bool) -> StagedKey:
        """Plan one streaming frame of stream ``kv`` for every block; stage its numbers.

        Returns:
            The key of the graph that runs this frame's attention.

        Raises:
            CachePoolExhaustedError: the special stream is full (nothing changed).
            CacheStateError: a frame already staged, or a stream of another pool.
        """
        if self._frame is not None:
            raise CacheStateError('stage_frame while a staged frame is in flight; finish first')
        if kv.pool is not self._pool:
            raise CacheStateError('stage_frame: the stream leases pages of another pool')
        plan = kv.plan_frame('keyframe' if keyframe else 'non-keyframe')
        self._index.copy_(plan.index)
        self._frame = (kv, plan)
        return self._attention.set(plan.layout, plan.special_base)

    def stage_placeholder(self, kv: StreamKV, keyframe: bool) -> StagedKey:
        """Stage a full-window layout without touching the table, to capture its graph early.

        The frame's writes go to the spare page and the first special slots of ``kv``'s own
        lease (no other stream's pages): reset that stream before real frames use it.

        Returns:
            The key of that layout's graph.
        """
        table = kv.table
        self._index.copy_(self._pool.storage.frame_index(table.first_page, table.special_base))
        return self._attention.set_placeholder(keyframe, table.first_page, table.special_base)

    def write(self, block_idx: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the staged frame's K and V ``[P, H, D]`` of ``block_idx`` (capturable)."""
        self._pool.storage.write(block_idx, self._index, k, v)

    def attend(self, block_idx: int, key: StagedKey, q: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the staged run of ``block_idx`` (capturable).

        Returns:
            ``[Q, H, D]`` in the storage dtype.
        """
        storage = self._pool.storage
        return self._attention.attend(key, q, storage.k[block_idx], storage.v[block_idx])

    def finish(self, failed: bool = False) -> None:
        """End the staged frame: a non-keyframe (or a failed frame) is rolled back.

        Raises:
            CacheStateError: no frame is staged.
        """
        if self._frame is None:
            raise CacheStateError('finish without a staged frame')
        (kv, plan), self._frame = self._frame, None
        kv.end_frame(plan, failed)
