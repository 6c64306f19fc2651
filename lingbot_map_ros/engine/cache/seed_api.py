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
"""The seed's cache API: ``FlashInferKVCacheManager``, an adapter over the engine's cache core.

An adapter, not part of the core (``page_pool``, ``page_table``, ``kv_pool``, ``stream_kv``,
``staged_*``): the engine never imports it (its streams plan a frame once for all layers,
``stream_kv.py``); it serves code written against the seed's per-block calls (tests, the cache
benchmark, ported callers), which import it as before from ``lingbot_map_ros.engine.cache``
or ``lingbot_map_ros.engine.cache.manager`` (re-exports). Only it uses ``step_log.py``.

Keeps the public API of upstream LingBot-Map's manager of the same name (constructor,
``append_frame``, ``evict_frames``, ``compute_attention``, ``reset``, ``get_cache_stats``; its
private helpers are not kept), plus a ``backend`` argument: 'flashinfer' (CUDA paged kernel),
'sdpa' (torch SDPA, any device), 'reference' (float32 gather + SDPA; what ``force_fp32=True``
means) or 'triton' (our kernel, CUDA), and an optional FP8 ``storage_dtype``.

Shapes: ``P = S + T`` tokens per frame (``S`` specials first, then ``T`` patches), ``H`` heads,
``D`` head dim. ``k, v, q: [P, H, D]``; a page holds ``T`` tokens (one frame's patches).

What a frame attends to (model spec 5.3; ``N_s`` scale frames, window ``W``):

* keyframe: ``append_frame`` -> ``evict_frames`` -> ``compute_attention``. Keys: the patches
  of the scale frames and of the last ``W`` keyframes (itself included) plus the ``S``
  specials of every cached frame: ``(N_s + min(n + 1 - N_s, W)) * T + S * (n + 1)`` for
  keyframe ``n``;
* non-keyframe: ``append_frame(keyframe=False)`` -> ``compute_attention`` ->
  ``rollback_last_frame``. It sees the ``W`` window frames plus itself; nothing stays;
* ``append_frame(keyframe=True)`` lets a keyframe take over the page of the frame it evicts;
  without it (upstream's call) the keyframe takes the spare page and ``evict_frames`` copies
  it into the evicted page, one page copy per block, to keep the visible pages contiguous;
* phase 1: ``append_frame`` once per scale frame, no attention.

Each block makes its calls for a frame before the next block starts. All blocks share one page
table (``step_log.py``): block 0 decides where the frame goes, the others replay it, so host
work per frame does not grow with the number of blocks. Page layout: ``page_table.py``.

The manager is one stream over a page pool of its own (``kv_pool.py``), sized for that stream
(the engine's streams share one pool).
"""

from __future__ import annotations

from typing import Any

from lingbot_map_ros.engine.attention.backend import AttentionBackend, BACKEND_NAMES
from lingbot_map_ros.engine.cache.kv_pool import KVPool
from lingbot_map_ros.engine.cache.kv_storage import KVStorage
from lingbot_map_ros.engine.cache.page_table import PageLayout, StepKind, TwoStreamPageTable
from lingbot_map_ros.engine.cache.step_log import LoggedStep, StepLog
from lingbot_map_ros.engine.cache.stream_kv import cache_stats, stream_pages
from lingbot_map_ros.engine.errors import CacheStateError
import torch


def _resolve_backend(backend: str | None, force_fp32: bool,
                     dtype: torch.dtype | str) -> tuple[str, torch.dtype]:
    """Backend name and storage dtype from the constructor arguments."""
    if isinstance(dtype, str):
        name = dtype.removeprefix('torch.')
        if not isinstance(getattr(torch, name, None), torch.dtype):
            raise ValueError(f"dtype='{dtype}' is not a torch dtype name")
        dtype = getattr(torch, name)
    if backend is None:
        backend = 'reference' if force_fp32 else 'flashinfer'
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend='{backend}' is not one of {', '.join(BACKEND_NAMES)}")
    if force_fp32:
        if backend == 'flashinfer':
            raise ValueError("force_fp32=True keeps float32 storage, which backend 'flashinfer'"
                             " cannot read; use backend 'reference' (the default then) or 'sdpa'")
        return backend, torch.float64 if dtype == torch.float64 else torch.float32
    return backend, dtype


class FlashInferKVCacheManager:
    """Paged two-stream KV cache for ``num_blocks`` global attention blocks.

    Args:
        num_blocks: Global attention blocks (layers) sharing the cache.
        max_num_frames: Accepted for upstream compatibility and unused (as upstream): the
            patch pool is sized by ``scale_frames + sliding_window + 1``.
        tokens_per_frame: ``P``, specials plus patches of one frame.
        num_heads: Heads ``H``.
        head_dim: Head dim ``D``.
        dtype: Storage dtype (or its name), kept as given (no silent cast), except with
            ``force_fp32``.
        device: Storage device.
        num_special_tokens: ``S``, specials at the start of each frame.
        scale_frames: ``N_s``, the first frames, pinned forever.
        sliding_window: ``W``, keyframes after the scale frames that keep their patches.
        max_total_frames: Capacity of the special stream, in frames.
        force_fp32: Store float32 (float64 stays float64); the default backend is then
            'reference' (upstream's float32 gather + SDPA path).
        backend: 'flashinfer' (default), 'sdpa', 'reference' or 'triton'.
        storage_dtype: K/V storage dtype when it differs from ``dtype`` (the attention
            dtype): ``torch.float8_e4m3fn`` (half the bytes; not with 'flashinfer').

    Raises:
        ValueError: bad sizes, unknown backend, or FlashInfer on CPU / in float32.
        ImportError: backend 'flashinfer' and the flashinfer package is not installed.
    """

    def __init__(self, num_blocks: int, max_num_frames: int, tokens_per_frame: int,
                 num_heads: int, head_dim: int, dtype: torch.dtype | str,
                 device: torch.device | str, num_special_tokens: int = 6,
                 scale_frames: int = 8, sliding_window: int = 64, max_total_frames: int = 2048,
                 force_fp32: bool = False, backend: str | None = None,
                 storage_dtype: torch.dtype | None = None) -> None:
        if tokens_per_frame <= num_special_tokens:
            raise ValueError(f'tokens_per_frame={tokens_per_frame} must exceed '
                             f'num_special_tokens={num_special_tokens} (a page holds patches)')
        if num_blocks < 1:
            raise ValueError(f'num_blocks={num_blocks} must be >= 1')
        self.num_blocks = num_blocks
        self.tokens_per_frame = tokens_per_frame
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_special_tokens = num_special_tokens
        self.scale_frames = scale_frames
        self.sliding_window = sliding_window
        self.max_total_frames = max_total_frames
        self.page_size = tokens_per_frame - num_special_tokens
        self.device = torch.device(device)
        self.backend_name, self.dtype = _resolve_backend(backend, force_fp32, dtype)
        num_pages = stream_pages(self.page_size, num_special_tokens, scale_frames,
                                 sliding_window, max_total_frames)
        self._pool = KVPool(num_layers=num_blocks, num_pages=num_pages,
                            page_size=self.page_size, num_heads=num_heads, head_dim=head_dim,
                            num_special_tokens=num_special_tokens, dtype=self.dtype,
                            device=self.device, backend=self.backend_name,
                            storage_dtype=storage_dtype,
                            full_patch_pages=scale_frames + sliding_window)
        # 'auto' resolved by the pool: the fastest backend this device runs.
        self.backend_name = self._pool.backend_name
        self.storage_dtype = self._pool.storage_dtype
        lease = self._pool.lease(self._pool.new_stream_id(), num_pages)
        self._table = TwoStreamPageTable(self.page_size, num_special_tokens, scale_frames,
                                         sliding_window, max_total_frames,
                                         first_page=lease.first_page,
                                         versions=self._pool.versions)
        self._backend = self._pool.backend
        self._storage = self._pool.storage
        self._log = StepLog(num_blocks, self._table.layout)
        self._frame_shape = (tokens_per_frame, num_heads, head_dim)
        # Upstream's flags: a non-keyframe is running (read by upstream's blocks), and its
        # eviction is deferred (append_frame then refuses keyframe=True).
        self.skip_append = False
        self.defer_eviction = False

    @property
    def page_table(self) -> TwoStreamPageTable:
        """Return the shared page table, at the leading block's step (for diagnostics)."""
        return self._table

    @property
    def backend(self) -> AttentionBackend:
        """Return the attention backend; its ``graph_support`` says what graphs may hold."""
        return self._backend

    @property
    def pool(self) -> KVPool:
        """Return the page pool the manager owns (one stream: this manager)."""
        return self._pool

    @property
    def storage(self) -> KVStorage:
        """Return the K/V pools of every block (``staged_frames.py`` writes and attends them)."""
        return self._storage

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V preallocated for all blocks."""
        return self._storage.num_bytes

    def append_frame(self, block_idx: int, k: torch.Tensor, v: torch.Tensor,
                     keyframe: bool | None = None) -> None:
        """Write one frame's keys and values ``[P, H, D]`` (specials first) to the cache.

        Args:
            block_idx: Global block index.
            k: Keys, post-RoPE, in the storage dtype (others are cast).
            v: Values.
            keyframe: True (fast path for keyframes): the frame stays; with a full window
                the oldest window frame is evicted now and the new frame takes its page
                (``evict_frames`` then has nothing left to do). False (non-keyframe): eviction
                is deferred and the frame takes the spare page until ``rollback_last_frame``.
                None (upstream's call): as False; if ``evict_frames`` follows, it evicts and
                moves the new frame's page into the evicted one (one page copy per block)
                so the visible pages stay contiguous.

        Raises:
            ValueError: bad ``block_idx`` or shapes, or ``keyframe=True`` while
                ``defer_eviction`` is set.
            CachePoolExhaustedError: the special stream holds ``max_total_frames`` frames.
            CacheStateError: a call out of order with the other blocks, or more frames in
                flight than the spare page allows.
        """
        if k.shape != self._frame_shape or v.shape != self._frame_shape:
            raise ValueError(f'append_frame(block {block_idx}): k {tuple(k.shape)} and v '
                             f'{tuple(v.shape)} must be [P, H, D] = {self._frame_shape}')
        if keyframe and self.defer_eviction:
            raise ValueError(f'append_frame(block {block_idx}, keyframe=True) while '
                             'defer_eviction is set (a non-keyframe is in flight)')
        logged = self.advance(block_idx, 'append', bool(keyframe))
        self._storage.write(block_idx, logged.index, k, v)
        if logged.step.moves:
            self._move_pages(block_idx, logged)

    def evict_frames(self, block_idx: int, scale_frames: int | None = None,
                     sliding_window: int | None = None, cross_frame_special: bool = True,
                     include_scale_frames: bool = True, camera_only: bool = False,
                     num_register_tokens: int = 4) -> None:
        """Evict the oldest window frames' patches so at most ``W`` window frames keep them.

        Their specials stay. Upstream's option arguments are accepted; only their default
        values (the behaviour upstream's paged manager implements) are supported.

        Args:
            block_idx: Global block index.
            scale_frames: Must equal the constructor's ``scale_frames`` when given.
            sliding_window: Must equal the constructor's ``sliding_window`` when given.
            cross_frame_special: Must be True.
            include_scale_frames: Must be True.
            camera_only: Must be False.
            num_register_tokens: Unused (the specials are cached as a whole).

        Raises:
            ValueError: bad ``block_idx`` or an argument that asks for other semantics.
            CacheStateError: a call out of order with the other blocks.
        """
        if scale_frames not in (None, self.scale_frames) \
                or sliding_window not in (None, self.sliding_window):
            raise ValueError(f'evict_frames(scale_frames={scale_frames}, sliding_window='
                             f'{sliding_window}): the cache was built for scale_frames='
                             f'{self.scale_frames}, sliding_window={self.sliding_window}')
        if not cross_frame_special or not include_scale_frames or camera_only:
            raise ValueError('evict_frames: only cross_frame_special=True, include_scale_frames'
                             f'=True, camera_only=False are supported, got {cross_frame_special}'
                             f', {include_scale_frames}, {camera_only}')
        logged = self.advance(block_idx, 'evict')
        if logged.step.moves:
            self._move_pages(block_idx, logged)

    def rollback_last_frame(self, block_idx: int) -> None:
        """Drop the newest frame: its patch page and its specials (the stream goes back).

        Raises:
            ValueError: bad ``block_idx``.
            CacheStateError: no frame is cached, or a call out of order with the other blocks.
        """
        logged = self.advance(block_idx, 'rollback')
        if logged.step.moves:
            self._move_pages(block_idx, logged)

    def compute_attention(self, block_idx: int, q: torch.Tensor) -> torch.Tensor:
        """Attend queries ``q: [Q, H, D]`` to the block's visible cached tokens.

        Returns:
            ``[Q, H, D]``: in the storage dtype ('flashinfer', 'sdpa'), or float32 / float64
            ('reference'). May be a non-contiguous view.

        Raises:
            ValueError: bad ``block_idx`` or shape.
            CacheStateError: the block has no cached frame.
        """
        self._check_block(block_idx)
        if q.dim() != 3 or q.shape[1:] != self._frame_shape[1:]:
            raise ValueError(f'compute_attention(block {block_idx}): q {tuple(q.shape)} must '
                             f'be [Q, {self.num_heads}, {self.head_dim}]')
        layout = self._log.layout(block_idx)
        if not layout.page_ids:
            raise CacheStateError(f'compute_attention(block {block_idx}): the cache holds no '
                                  'frame; append_frame first')
        self._backend.plan(layout, q.shape[0])
        return self._backend.run(q, self._storage.k[block_idx], self._storage.v[block_idx],
                                 layout)

    def plan(self, block_idx: int = 0, num_queries: int | None = None) -> None:
        """Prepare the backend for the block's layout now (``compute_attention`` does it too).

        Args:
            block_idx: Global block index.
            num_queries: Query tokens; default ``tokens_per_frame``.
        """
        self._check_block(block_idx)
        layout = self._log.layout(block_idx)
        if layout.page_ids:
            self._backend.plan(layout, num_queries or self.tokens_per_frame)

    def reset(self) -> None:
        """Empty the cache (all blocks); the tensors stay allocated."""
        self._table.reset()
        self._log.reset(self._table.layout)

    def remaining_frames(self) -> int:
        """Keyframes that still fit before ``append_frame`` raises CachePoolExhaustedError."""
        return self._table.remaining_frames()

    def layout(self, block_idx: int = 0) -> PageLayout:
        """Return the block's visible pages (scale -> window -> special) as a frozen snapshot."""
        self._check_block(block_idx)
        return self._log.layout(block_idx)

    def get_cache_stats(self, block_idx: int = 0) -> dict[str, Any]:
        """Occupancy and capacity of the cache as ``block_idx`` sees it.

        Returns:
            ``frame_count`` (frames in the special stream), ``scale_pages``, ``live_pages``
            (window pages), ``free_pages`` (free patch pages), ``special_tokens``,
            ``special_pages``, ``free_special_pages``, ``visible_tokens``, ``contiguous``,
            ``page_size``, ``num_patch_pages``, ``num_special_pages``, ``max_total_frames``,
            ``remaining_frames``, ``kv_bytes`` (allocated, all blocks), ``kv_bytes_used``
            (visible pages, all blocks), ``backend``, ``dtype``, and the pool's
            ``pool_pages_total``, ``pool_pages_free``, ``pool_streams``.
        """
        return cache_stats(self.layout(block_idx), self._table, self._storage, self._pool)

    def _check_block(self, block_idx: int) -> None:
        if not 0 <= block_idx < self.num_blocks:
            raise ValueError(f'block_idx={block_idx} is outside [0, {self.num_blocks})')

    def advance(self, block_idx: int, kind: StepKind, keyframe: bool = True) -> LoggedStep:
        """Make block ``block_idx``'s next table step: lead a new one or replay the recorded one.

        Returns:
            The step and, for an append, where the frame's tokens go.

        Raises:
            ValueError: bad ``block_idx``.
            CachePoolExhaustedError: an append with the special stream full.
            CacheStateError: a call out of order with the other blocks.
        """
        self._check_block(block_idx)
        if not self._log.leads(block_idx):
            return self._log.follow(block_idx, kind, keyframe)
        self._log.reserve(block_idx)
        if kind == 'append':
            step = self._table.append(keyframe)
            index = self._storage.frame_index(step.patch_page, step.special_start)
            logged = LoggedStep(step, keyframe, index)
        elif kind == 'evict':
            logged = LoggedStep(self._table.evict())
        else:
            logged = LoggedStep(self._table.rollback())
        self._log.record(block_idx, logged)
        return logged

    def _move_pages(self, block_idx: int, logged: LoggedStep) -> None:
        for move in logged.step.moves:
            self._storage.move_page(block_idx, move.src, move.dst)
