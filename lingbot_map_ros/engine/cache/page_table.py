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
"""TwoStreamPageTable: where every cached token of the two-stream KV cache lives (pure Python).

A frame of ``P = S + page_size`` tokens (``S`` specials first, then ``page_size`` patches) is
split into two streams (model spec 5.3-5.4):

* the *patch stream*: one page per frame holding its patches. The first ``N_s`` frames are
  scale frames and keep their page forever; later frames form a sliding window of the last
  ``W`` keyframes, and a frame that leaves the window gives its page back;
* the *special stream*: the ``S`` specials of every cached frame, append-only and packed
  across page boundaries (frame ``i`` owns stream tokens ``[S*i, S*i + S)``).

Physical layout of one layer's pool (``R = N_s + W + 1`` patch pages, then the special pages):

::

    page id  0 ........ lo-1 | lo ....... W | W+1 ..... R-1 | R ...... R+n-1 | R+n ...
             free patch pages| window frames| scale frames  | special stream | free
                             '------------ visible run: one contiguous range -----'

Scale frames take the top patch pages (next to the specials), window frames grow downwards
below them, and the special stream grows upwards. The table keeps every visible page inside
one contiguous range ``[lo, R + n)``; attention is order-independent, so an attention kernel
can read the whole visible set as one strided view with no gather. That needs:

* a keyframe arriving with a full window takes over the page of the frame it evicts
  (``append(keyframe=True)`` evicts first, then fills the hole; no data moves);
* a non-keyframe (``keyframe=False``; eviction deferred) takes the spare page just below the
  run, so it sees ``W`` window frames plus itself, and ``rollback`` gives the page back;
* any other order of calls that leaves a hole inside the run is repaired at the end of the
  call by moving the lowest window page into the hole; the call's ``TableStep.moves`` says
  which page to copy where, in every layer.

The table hands out frozen ``PageLayout`` snapshots (never its own lists), and one
``TableStep`` per call so that every layer can replay the same physical writes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
import itertools
from typing import Literal, NamedTuple

from lingbot_map_ros.engine.attention.page_layout import PageLayout
from lingbot_map_ros.engine.cache.page_pool import PagePool
from lingbot_map_ros.engine.errors import CachePoolExhaustedError, CacheStateError

StepKind = Literal['append', 'evict', 'rollback']


class PageMove(NamedTuple):
    """Copy page ``src`` to page ``dst`` (both K and V, in every layer)."""

    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class TableStep:
    """What one table call did: the layout after it and the physical writes it implies."""

    kind: StepKind
    """The call: 'append', 'evict' or 'rollback'."""
    layout: PageLayout
    """Visible pages after the call."""
    patch_page: int = -1
    """append: page that receives the frame's patches."""
    special_start: int = -1
    """append: pool token index (``page * page_size + offset``) of the frame's first special."""
    moves: tuple[PageMove, ...] = ()
    """Page copies that keep the visible run contiguous, in order."""


@dataclass(slots=True)
class _WindowFrame:
    frame: int
    page: int


class TwoStreamPageTable:
    """Page bookkeeping of the two-stream cache, shared by all layers.

    Args:
        page_size: Tokens per page (= patches per frame).
        num_special_tokens: Specials per frame (6 for LingBot-Map).
        scale_frames: ``N_s``, frames pinned forever (the first ``N_s`` appended).
        sliding_window: ``W``, keyframes after the scale frames that keep their patches.
        max_total_frames: Capacity of the special stream, in frames.
        first_page: Pool page id of the table's page 0: a stream's table works on its lease
            ``[first_page, first_page + num_pages)`` of a shared pool (``kv_pool.py``); every
            page id and token index the table hands out is a pool id.
        versions: Source of layout versions, shared by every table of one pool so that a
            version names one layout of one stream (backends key their plans on it).

    Raises:
        ValueError: a size out of range.
    """

    def __init__(self, page_size: int, num_special_tokens: int, scale_frames: int,
                 sliding_window: int, max_total_frames: int, first_page: int = 0,
                 versions: Iterator[int] | None = None) -> None:
        for name, value, low in (('page_size', page_size, 1),
                                 ('num_special_tokens', num_special_tokens, 0),
                                 ('scale_frames', scale_frames, 0),
                                 ('sliding_window', sliding_window, 1),
                                 ('max_total_frames', max_total_frames, 1),
                                 ('first_page', first_page + 1, 1)):
            if value < low:
                raise ValueError(f'page table: {name}={value} must be >= {low}')
        self.page_size = page_size
        self.num_special_tokens = num_special_tokens
        self.scale_frames = scale_frames
        self.sliding_window = sliding_window
        self.max_total_frames = max_total_frames
        self.first_page = first_page
        self._versions = versions if versions is not None else itertools.count(1)
        # One spare patch page: the non-keyframe in flight (append -> attend -> rollback).
        self.num_patch_pages = scale_frames + sliding_window + 1
        self.num_special_pages = -(-max_total_frames * num_special_tokens // page_size)
        self._patches = PagePool(self.num_patch_pages, 'patch')
        self._specials = PagePool(self.num_special_pages, 'special')
        self._scale: list[int] = []
        self._window: deque[_WindowFrame] = deque()
        self._holes: set[int] = set()
        self._run_low = self.num_patch_pages
        self._num_frames = 0
        self._version = next(self._versions)
        self._layout = self._build_layout()

    @property
    def special_base(self) -> int:
        """Pool token index of the special stream's first token."""
        return (self.first_page + self.num_patch_pages) * self.page_size

    @property
    def num_pages(self) -> int:
        """Pages per layer: patch pages, then special pages."""
        return self.num_patch_pages + self.num_special_pages

    @property
    def num_frames(self) -> int:
        """Frames in the special stream."""
        return self._num_frames

    @property
    def num_free_patch_pages(self) -> int:
        """Patch pages not in use."""
        return self._patches.num_free

    @property
    def num_used_special_pages(self) -> int:
        """Return the special pages holding at least one token."""
        return self._specials.num_used

    @property
    def layout(self) -> PageLayout:
        """Visible pages now."""
        return self._layout

    def remaining_frames(self) -> int:
        """How many more keyframes fit before ``append`` raises CachePoolExhaustedError."""
        return self.max_total_frames - self._num_frames

    def page_owner(self, page_id: int) -> int:
        """Stream index of the frame whose patches sit in patch page ``page_id`` (-1: free).

        Raises:
            ValueError: ``page_id`` is not a patch page.
        """
        return self._patches.owner(page_id - self.first_page)

    def reset(self) -> None:
        """Forget every frame and free every page."""
        self._patches.reset()
        self._specials.reset()
        self._scale.clear()
        self._window.clear()
        self._holes.clear()
        self._run_low = self.num_patch_pages
        self._num_frames = 0
        self._version = next(self._versions)
        self._layout = self._build_layout()

    def append(self, keyframe: bool = True) -> TableStep:
        """Place the next frame: a patch page and ``num_special_tokens`` stream slots.

        Args:
            keyframe: True: the frame stays, so when the window is full the oldest window
                frame is evicted now and its page reused. False: eviction is deferred (the
                frame will be rolled back); it takes the spare page.

        Returns:
            The step, with ``patch_page`` and ``special_start`` set.

        Raises:
            CachePoolExhaustedError: the special stream holds ``max_total_frames`` frames.
            CacheStateError: no patch page left (frames appended without evict/rollback).
        """
        frame = self._num_frames
        if frame >= self.max_total_frames:
            raise CachePoolExhaustedError(
                f'KV cache full: the special stream holds {frame} frames = max_total_frames='
                f'{self.max_total_frames}; reset the session or raise max_total_frames')
        if frame < self.scale_frames:
            page = self._take_patch_page(frame)
            self._scale.append(page)
        else:
            if keyframe:
                while len(self._window) >= self.sliding_window:
                    self._free_patch_page(self._window.popleft().page)
            page = self._take_patch_page(frame)
            self._window.append(_WindowFrame(frame, page))
        while self._specials.num_used < self._special_pages_for(frame + 1):
            self._specials.allocate(frame, self._specials.num_used)
        self._num_frames = frame + 1
        moves = self._compact()
        special_start = self.special_base + self.num_special_tokens * frame
        return TableStep('append', self._changed(), page + self.first_page, special_start,
                         moves)

    def evict(self) -> TableStep:
        """Evict the oldest window frames until at most ``sliding_window`` hold patches.

        Their specials stay in the special stream.

        Returns:
            The step; its layout is the previous object when nothing was evicted.
        """
        if len(self._window) <= self.sliding_window:
            return TableStep('evict', self._layout)
        while len(self._window) > self.sliding_window:
            self._free_patch_page(self._window.popleft().page)
        moves = self._compact()
        return TableStep('evict', self._changed(), moves=moves)

    def rollback(self) -> TableStep:
        """Remove the newest frame: its patch page (if it still has one) and its specials.

        Returns:
            The step.

        Raises:
            CacheStateError: no frame is cached.
        """
        if self._num_frames == 0:
            raise CacheStateError('rollback_last_frame: the cache holds no frame')
        frame = self._num_frames - 1
        if frame < self.scale_frames:
            self._free_patch_page(self._scale.pop())
        elif self._window and self._window[-1].frame == frame:
            self._free_patch_page(self._window.pop().page)
        while self._specials.num_used > self._special_pages_for(frame):
            self._specials.free(self._specials.num_used - 1)
        self._num_frames = frame
        moves = self._compact()
        return TableStep('rollback', self._changed(), moves=moves)

    def _special_pages_for(self, num_frames: int) -> int:
        return -(-self.num_special_tokens * num_frames // self.page_size)

    def _take_patch_page(self, frame: int) -> int:
        if self._holes:
            page = max(self._holes)
            self._holes.discard(page)
        else:
            page = self._run_low - 1
            if page < 0:
                raise CacheStateError(
                    f'all {self.num_patch_pages} patch pages are in use ({len(self._scale)} '
                    f'scale + {len(self._window)} window frames, sliding_window='
                    f'{self.sliding_window}): call evict_frames after a keyframe append or '
                    'rollback_last_frame after a non-keyframe before appending again')
            self._run_low = page
        return self._patches.allocate(frame, page)

    def _free_patch_page(self, page: int) -> None:
        self._patches.free(page)
        if page != self._run_low:
            self._holes.add(page)
            return
        # The run shrinks from below, past any hole it reaches.
        while self._run_low < self.num_patch_pages and self._patches.is_free(self._run_low):
            self._holes.discard(self._run_low)
            self._run_low += 1

    def _compact(self) -> tuple[PageMove, ...]:
        # Holes are free pages above the run's lowest page; move the lowest frame into each.
        moves = []
        while self._holes:
            hole = max(self._holes)
            self._holes.discard(hole)
            src = self._run_low
            frame = self._patches.owner(src)
            self._patches.allocate(frame, hole)
            if frame < self.scale_frames:
                self._scale[frame] = hole
            else:
                self._window[frame - self._window[0].frame].page = hole
            moves.append(PageMove(src + self.first_page, hole + self.first_page))
            self._free_patch_page(src)
        return tuple(moves)

    def _changed(self) -> PageLayout:
        self._version = next(self._versions)
        self._layout = self._build_layout()
        return self._layout

    def _build_layout(self) -> PageLayout:
        num_special = self._specials.num_used
        base = self.first_page
        page_ids = (tuple(base + p for p in self._scale)
                    + tuple(base + w.page for w in self._window)
                    + tuple(range(base + self.num_patch_pages,
                                  base + self.num_patch_pages + num_special)))
        if num_special:
            last_page_len = self.num_special_tokens * self._num_frames \
                - (num_special - 1) * self.page_size
        else:
            last_page_len = self.page_size if page_ids else 0
        return PageLayout.build(page_ids, self.page_size, last_page_len, self._num_frames,
                                len(self._scale), len(self._window), self._version)
