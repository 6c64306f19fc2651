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

A whole streaming frame can be one CUDA graph (``model/graphed.py``) only if the cache work
inside it needs no host decision. :meth:`StagedFrames.stage_frame` makes the frame's table steps
for every block at once and puts where the frame goes and what it sees into device tensors; the
graph then calls :meth:`~StagedFrames.write` and :meth:`~StagedFrames.attend` per block;
:meth:`~StagedFrames.finish` ends the frame. Only backends whose ``graph_support`` is
'whole_frame' (and, on CUDA, bf16/fp16 storage) can stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lingbot_map_ros.engine.attention.staged import StagedAttention, StagedKey
from lingbot_map_ros.engine.cache.step_log import LoggedStep
from lingbot_map_ros.engine.errors import CacheStateError
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.cache.manager import FlashInferKVCacheManager


def can_stage(cache: FlashInferKVCacheManager) -> bool:
    """Tell whether ``cache`` can stage frames.

    It can when its backend declares 'whole_frame' graph support and the storage is bf16/fp16 on
    CUDA (any dtype elsewhere).
    """
    if cache.backend.graph_support != 'whole_frame':
        return False
    return cache.device.type != 'cuda' or cache.dtype in (torch.bfloat16, torch.float16)


class StagedFrames:
    """The staged-frame protocol over one cache manager (which keeps the page table)."""

    def __init__(self, cache: FlashInferKVCacheManager, compile_merge: bool = False) -> None:
        """Build the device-side numbers.

        Args:
            cache: the manager whose table and storage the frames go through.
            compile_merge: ``torch.compile`` the split's log-sum-exp merge.

        Raises:
            CacheStateError: the cache cannot stage (see :func:`can_stage`).
        """
        if not can_stage(cache):
            raise CacheStateError('staged frames need a whole-frame backend (sdpa, triton) '
                                  f'with bf16/fp16 on CUDA, not {cache.backend_name} with '
                                  f'{cache.dtype} on {cache.device}')
        self._cache = cache
        table = cache.page_table
        self._attention = StagedAttention(
            cache.backend.split, cache.page_size, table.num_patch_pages,  # type: ignore
            cache.scale_frames + cache.sliding_window, cache.num_special_tokens, cache.device,
            compile_merge, run_kernel=cache.backend.kernel)  # type: ignore
        self._index = torch.zeros(cache.tokens_per_frame, dtype=torch.long, device=cache.device)
        self._keyframe: bool | None = None

    def warm_up(self, q: torch.Tensor) -> None:
        """Compile the staged merge for queries shaped like ``q: [Q, H, D]`` now (CUDA)."""
        storage = self._cache.storage
        self._attention.warm_up(q, storage.k[0], storage.v[0])

    def stage_frame(self, keyframe: bool) -> StagedKey:
        """Make one streaming frame's table steps for every block; stage its numbers.

        A keyframe: append + evict; a non-keyframe: append (``finish`` rolls it back).

        Returns:
            The key of the graph that runs this frame's attention.

        Raises:
            CachePoolExhaustedError: the special stream is full (nothing changed).
            CacheStateError: a frame already staged, blocks out of step, or a step that would
                move pages (never for keyframe True/False appends).
        """
        if self._keyframe is not None:
            raise CacheStateError('stage_frame while a staged frame is in flight; finish first')
        cache = self._cache
        first = cache.advance(0, 'append', keyframe)
        _check_no_moves(first)
        for block_idx in range(1, cache.num_blocks):
            cache.advance(block_idx, 'append', keyframe)
        if keyframe:
            for block_idx in range(cache.num_blocks):
                _check_no_moves(cache.advance(block_idx, 'evict'))
        self._index.copy_(first.index)
        self._keyframe = keyframe
        return self._attention.set(cache.layout(0))

    def stage_placeholder(self, keyframe: bool) -> StagedKey:
        """Stage a full-window layout without touching the table, to capture its graph early.

        The frame's writes go to the spare page and the first special slots: reset the cache
        before real frames use it.

        Returns:
            The key of that layout's graph.
        """
        cache = self._cache
        spare = cache.page_table.num_patch_pages * cache.page_size
        self._index.copy_(cache.storage.frame_index(0, spare))
        return self._attention.set_placeholder(keyframe)

    def write(self, block_idx: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the staged frame's K and V ``[P, H, D]`` of ``block_idx`` (capturable)."""
        self._cache.storage.write(block_idx, self._index, k, v)

    def attend(self, block_idx: int, key: StagedKey, q: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the staged run of ``block_idx`` (capturable).

        Returns:
            ``[Q, H, D]`` in the storage dtype.
        """
        storage = self._cache.storage
        return self._attention.attend(key, q, storage.k[block_idx], storage.v[block_idx])

    def finish(self) -> None:
        """End the staged frame: a non-keyframe is rolled back in every block.

        Raises:
            CacheStateError: no frame is staged.
        """
        if self._keyframe is None:
            raise CacheStateError('finish without a staged frame')
        keyframe, self._keyframe = self._keyframe, None
        if not keyframe:
            for block_idx in range(self._cache.num_blocks):
                _check_no_moves(self._cache.advance(block_idx, 'rollback'))


def _check_no_moves(logged: LoggedStep) -> None:
    if logged.step.moves:
        raise CacheStateError(f'staged {logged.step.kind} would move pages {logged.step.moves}; '
                              'stage only keyframe/non-keyframe appends')
