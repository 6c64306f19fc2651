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
"""PagePool: which page ids of a KV pool are in use, and by which frame (pure Python).

A pool hands out integer page ids in ``[0, num_pages)``. It holds no tensors: the page table
decides *which* page a frame gets (placement matters for the contiguous visible run, see
``page_table.py``), and the pool checks that no page is used twice or freed twice. Every
operation is O(1): the free ids sit in a stack, and each page remembers its position in that
stack so a specific page can be taken out of the middle by swapping it with the top.
"""

from __future__ import annotations

from dataclasses import dataclass

from lingbot_map_ros.engine.errors import CachePoolExhaustedError, CacheStateError

NO_FRAME = -1
"""``Page.frame`` of a free page."""


@dataclass(slots=True)
class Page:
    """Metadata of one physical page."""

    page_id: int
    """Index of the page in the layer's KV tensors (first dim)."""
    frame: int = NO_FRAME
    """Stream index of the frame whose tokens the page holds; ``NO_FRAME`` when free."""
    free_slot: int = NO_FRAME
    """Position of the page in the pool's free stack; ``NO_FRAME`` when in use."""


class PagePool:
    """Free list and ownership of the page ids ``[0, num_pages)``.

    Args:
        num_pages: Number of pages the pool manages.
        name: Name used in error messages (e.g. ``'patch'``).

    Raises:
        ValueError: ``num_pages`` is negative.
    """

    def __init__(self, num_pages: int, name: str = 'page') -> None:
        if num_pages < 0:
            raise ValueError(f'{name} pool: num_pages={num_pages} must be >= 0')
        self._name = name
        self._pages = [Page(i) for i in range(num_pages)]
        self._free: list[int] = []
        self.reset()

    @property
    def num_pages(self) -> int:
        """Return the number of pages the pool manages."""
        return len(self._pages)

    @property
    def num_free(self) -> int:
        """Return the number of pages not in use."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Return the number of pages in use."""
        return len(self._pages) - len(self._free)

    def reset(self) -> None:
        """Free every page. The free stack pops the highest id first."""
        self._free = list(range(len(self._pages)))
        for page in self._pages:
            page.frame = NO_FRAME
            page.free_slot = page.page_id

    def is_free(self, page_id: int) -> bool:
        """Whether ``page_id`` is free.

        Raises:
            ValueError: ``page_id`` is outside the pool.
        """
        return self._page(page_id).free_slot != NO_FRAME

    def owner(self, page_id: int) -> int:
        """Stream index of the frame that holds ``page_id`` (``NO_FRAME`` if free).

        Raises:
            ValueError: ``page_id`` is outside the pool.
        """
        return self._page(page_id).frame

    def allocate(self, frame: int, page_id: int | None = None) -> int:
        """Take a page for ``frame``: ``page_id`` if given, else the top of the free stack.

        Args:
            frame: Stream index of the frame the page will hold (>= 0).
            page_id: The page to take, or ``None`` for any free page.

        Returns:
            The page id taken.

        Raises:
            CachePoolExhaustedError: no free page (``page_id=None``).
            CacheStateError: ``page_id`` is already in use.
            ValueError: ``page_id`` is outside the pool or ``frame`` < 0.
        """
        if frame < 0:
            raise ValueError(f'{self._name} pool: frame={frame} must be >= 0')
        if page_id is None:
            if not self._free:
                raise CachePoolExhaustedError(
                    f'{self._name} pool: all {self.num_pages} pages are in use')
            page_id = self._free[-1]
        page = self._page(page_id)
        if page.free_slot == NO_FRAME:
            raise CacheStateError(f'{self._name} pool: page {page_id} is already used by '
                                  f'frame {page.frame} (asked for frame {frame})')
        # Swap-remove from the free stack keeps allocation of a given id O(1).
        top_id = self._free.pop()
        if top_id != page_id:
            self._free[page.free_slot] = top_id
            self._pages[top_id].free_slot = page.free_slot
        page.free_slot = NO_FRAME
        page.frame = frame
        return page_id

    def free(self, page_id: int) -> None:
        """Return ``page_id`` to the free stack.

        Raises:
            CacheStateError: the page is already free.
            ValueError: ``page_id`` is outside the pool.
        """
        page = self._page(page_id)
        if page.free_slot != NO_FRAME:
            raise CacheStateError(f'{self._name} pool: page {page_id} is freed twice')
        page.free_slot = len(self._free)
        page.frame = NO_FRAME
        self._free.append(page_id)

    def reassign(self, page_id: int, frame: int) -> None:
        """Hand a used page to another frame without freeing it (page reuse in place).

        Raises:
            CacheStateError: the page is free.
            ValueError: ``page_id`` is outside the pool.
        """
        page = self._page(page_id)
        if page.free_slot != NO_FRAME:
            raise CacheStateError(f'{self._name} pool: cannot reassign free page {page_id}')
        page.frame = frame

    def _page(self, page_id: int) -> Page:
        if not 0 <= page_id < len(self._pages):
            raise ValueError(f'{self._name} pool: page id {page_id} is outside '
                             f'[0, {len(self._pages)})')
        return self._pages[page_id]
