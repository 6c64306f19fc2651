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
"""PageLayout: the pages a frame's queries attend to, as the page table hands them to a backend.

The cache's page table (``engine/cache/page_table.py``) builds one per table change; every
attention backend plans and runs on it (``backend.py``). It lives with the backends, which define
what they are given, so the cache depends on the attention and not the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PageLayout:
    """The pages a query attends to, in logical order: scale -> window -> special.

    Only the last page may be partly filled (``last_page_len`` tokens); every other page holds
    ``page_size`` tokens. ``first_page`` is set when the visible *tokens* are one contiguous
    range of the pool's flat token space: the pages form one range (in any order) and the
    partly filled last page, if any, is the highest one.
    """

    page_ids: tuple[int, ...]
    """Visible page ids: scale frames (oldest first), window frames (oldest first), specials."""
    page_size: int
    """Tokens per page."""
    last_page_len: int
    """Valid tokens in the last page (0 when there is no page)."""
    num_frames: int
    """Frames in the special stream (every cached frame, scale and window frames included)."""
    num_scale_pages: int
    """Leading entries of ``page_ids`` that are scale-frame patch pages."""
    num_window_pages: int
    """Entries after the scale pages that are window-frame patch pages."""
    first_page: int
    """Lowest page id if the visible tokens are one contiguous token range, else -1."""
    version: int
    """Counter that changes whenever the table changes; backends key their plans on it."""

    @classmethod
    def build(cls, page_ids: tuple[int, ...], page_size: int, last_page_len: int,
              num_frames: int, num_scale_pages: int, num_window_pages: int,
              version: int) -> 'PageLayout':
        """Build a layout and find out whether its tokens are one contiguous range."""
        first_page = -1
        if page_ids:
            low, high = min(page_ids), max(page_ids)
            if high - low + 1 == len(page_ids) \
                    and (last_page_len == page_size or page_ids[-1] == high):
                first_page = low
        return cls(page_ids, page_size, last_page_len, num_frames, num_scale_pages,
                   num_window_pages, first_page, version)

    @property
    def num_pages(self) -> int:
        """Return the number of visible pages."""
        return len(self.page_ids)

    @property
    def num_special_pages(self) -> int:
        """Visible pages of the special stream."""
        return len(self.page_ids) - self.num_scale_pages - self.num_window_pages

    @property
    def num_tokens(self) -> int:
        """Return the number of visible key/value tokens."""
        if not self.page_ids:
            return 0
        return (len(self.page_ids) - 1) * self.page_size + self.last_page_len

    @property
    def is_contiguous(self) -> bool:
        """Whether the visible tokens are one contiguous range of the pool."""
        return self.first_page >= 0
