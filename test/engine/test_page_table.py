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
"""TwoStreamPageTable: hand-drawn page layouts for every kind of call, and its errors.

Run: ``python -m pytest test/engine/test_page_table.py`` (repo root; CPU only, < 1 s).

Configuration of the drawings: N_s = 2 scale frames, W = 3, page_size = 4 patches, 6 specials
per frame (so every frame's specials cross a page boundary), max_total_frames = 10.
Patch pages are 0..5 (R = N_s + W + 1 = 6), special pages 6..20 (ceil(10 * 6 / 4) = 15).
In the drawings ``fN`` is frame N's patch page, ``sK`` the special stream's page K, ``.`` free.
"""

from lingbot_map_ros.engine.cache.page_table import PageLayout, PageMove, TwoStreamPageTable
from lingbot_map_ros.engine.errors import CachePoolExhaustedError, CacheStateError
import pytest

SPECIALS = tuple(range(6, 21))


def _table(max_total_frames: int = 10) -> TwoStreamPageTable:
    return TwoStreamPageTable(page_size=4, num_special_tokens=6, scale_frames=2,
                              sliding_window=3, max_total_frames=max_total_frames)


def _check(layout: PageLayout, page_ids: tuple, last_page_len: int, first_page: int,
           num_frames: int, scale: int, window: int) -> None:
    assert layout.page_ids == page_ids
    assert layout.last_page_len == last_page_len
    assert layout.first_page == first_page
    assert (layout.num_frames, layout.num_scale_pages, layout.num_window_pages) == \
        (num_frames, scale, window)
    assert layout.num_tokens == (scale + window) * 4 + 6 * num_frames


def test_sizes():
    table = _table()
    assert (table.num_patch_pages, table.num_special_pages, table.num_pages) == (6, 15, 21)
    layout = table.layout
    assert layout.page_ids == () and layout.num_tokens == 0 and layout.last_page_len == 0


def test_scale_frames_then_window_growth():
    table = _table()
    # page:  0  1  2  3  4  5 | 6  7
    #        .  .  .  .  . f0 | s0 s1      f0's specials: tokens 0-3 on s0, 4-5 on s1
    step = table.append(keyframe=True)
    assert (step.kind, step.patch_page, step.special_start, step.moves) == \
        ('append', 5, 6 * 4 + 0, ())
    _check(step.layout, (5, 6, 7), 2, 5, 1, 1, 0)
    # page:  0  1  2  3  4  5 | 6  7  8
    #        .  .  .  .  f1 f0| s0 s1 s2   f1's specials: tokens 6-7 on s1, 8-11 on s2
    step = table.append(keyframe=True)
    assert (step.patch_page, step.special_start) == (4, 24 + 6)
    _check(step.layout, (5, 4, 6, 7, 8), 4, 4, 2, 2, 0)
    # page:  0  1  2  3  4  5 | 6 .. 10
    #        .  .  . f2 f1 f0 | s0 .. s4   (s4 holds 2 tokens)
    step = table.append(keyframe=True)
    assert (step.patch_page, step.special_start) == (3, 24 + 12)
    _check(step.layout, (5, 4, 3) + SPECIALS[:5], 2, 3, 3, 2, 1)
    assert table.evict().layout is step.layout  # nothing to evict: same snapshot
    assert table.num_free_patch_pages == 3 and table.num_used_special_pages == 5
    assert [table.page_owner(p) for p in range(6)] == [-1, -1, -1, 2, 1, 0]


def _fill_window(table: TwoStreamPageTable) -> PageLayout:
    for _ in range(5):
        table.append(keyframe=True)
        table.evict()
    # page:  0  1  2  3  4  5 | 6 .. 13
    #        . f4 f3 f2 f1 f0 | s0 .. s7   (s7 holds 2 tokens)
    return table.layout


def test_non_keyframe_takes_the_spare_page_and_rolls_back():
    table = _table()
    before = _fill_window(table)
    _check(before, (5, 4, 3, 2, 1) + SPECIALS[:8], 2, 1, 5, 2, 3)
    # Non-keyframe f5 sees W window frames plus itself:
    # page:  0  1  2  3  4  5 | 6 .. 14
    #       f5 f4 f3 f2 f1 f0 | s0 .. s8
    step = table.append(keyframe=False)
    assert step.patch_page == 0
    _check(step.layout, (5, 4, 3, 2, 1, 0) + SPECIALS[:9], 4, 0, 6, 2, 4)
    # Rollback: page 0 and the special page s8 are free again.
    step = table.rollback()
    assert step.moves == ()
    _check(step.layout, before.page_ids, 2, 1, 5, 2, 3)
    assert table.num_free_patch_pages == 1 and table.num_used_special_pages == 8
    assert step.layout.version != before.version


def test_keyframe_with_full_window_takes_the_evicted_page():
    table = _table()
    _fill_window(table)
    # Keyframe f5 evicts f2 (page 3) and reuses its page; no page moves:
    # page:  0  1  2  3  4  5 | 6 .. 14
    #        . f4 f3 f5 f1 f0 | s0 .. s8
    step = table.append(keyframe=True)
    assert (step.patch_page, step.moves) == (3, ())
    _check(step.layout, (5, 4, 2, 1, 3) + SPECIALS[:9], 4, 1, 6, 2, 3)
    assert table.evict().moves == ()
    assert table.page_owner(3) == 5


def test_upstream_order_moves_the_new_page_into_the_evicted_one():
    table = _table()
    _fill_window(table)
    table.append(keyframe=True)
    table.evict()
    # Keyframe f6 appended without the hint takes the spare page 0 ...
    # page:  0  1  2  3  4  5 | 6 .. 16
    #       f6 f4 f3 f5 f1 f0 | s0 .. s10
    step = table.append(keyframe=False)
    assert step.patch_page == 0
    _check(step.layout, (5, 4, 2, 1, 3, 0) + SPECIALS[:11], 2, 0, 7, 2, 4)
    # ... evict drops f3 (page 2) and moves f6 from page 0 into page 2:
    # page:  0  1  2  3  4  5 | 6 .. 16
    #        . f4 f6 f5 f1 f0 | s0 .. s10
    step = table.evict()
    assert step.moves == (PageMove(0, 2),)
    _check(step.layout, (5, 4, 1, 3, 2) + SPECIALS[:11], 2, 1, 7, 2, 3)
    # Rolling back f6 (page 2, inside the run) moves the lowest frame f4 up into page 2:
    # page:  0  1  2  3  4  5 | 6 .. 14
    #        .  . f4 f5 f1 f0 | s0 .. s8
    step = table.rollback()
    assert step.moves == (PageMove(1, 2),)
    _check(step.layout, (5, 4, 2, 3) + SPECIALS[:9], 4, 2, 6, 2, 2)
    assert table.num_free_patch_pages == 2 and table.num_used_special_pages == 9


def test_too_many_frames_in_flight_is_a_state_error():
    table = _table()
    _fill_window(table)
    table.append(keyframe=False)
    with pytest.raises(CacheStateError, match='all 6 patch pages are in use'):
        table.append(keyframe=False)
    # The failed call changed nothing.
    assert table.layout.num_frames == 6 and table.num_free_patch_pages == 0


def test_special_stream_full_names_max_total_frames():
    table = _table(max_total_frames=3)
    for _ in range(3):
        table.append(keyframe=True)
    assert table.remaining_frames() == 0
    with pytest.raises(CachePoolExhaustedError, match='max_total_frames=3'):
        table.append(keyframe=True)
    table.rollback()
    assert table.remaining_frames() == 1


def test_rollback_on_empty_table_and_bad_sizes():
    with pytest.raises(CacheStateError, match='holds no frame'):
        _table().rollback()
    with pytest.raises(ValueError, match='sliding_window=0'):
        TwoStreamPageTable(4, 6, 2, 0, 10)
    with pytest.raises(ValueError, match='page_size=0'):
        TwoStreamPageTable(0, 6, 2, 3, 10)


def test_reset_frees_everything():
    table = _table()
    _fill_window(table)
    version = table.layout.version
    table.reset()
    assert table.layout.page_ids == () and table.layout.version > version
    assert table.num_free_patch_pages == 6 and table.num_used_special_pages == 0
    assert table.append(keyframe=True).patch_page == 5


def test_layout_contiguity_rule():
    # Pages 3..5 in any order with the partly filled (last) page highest: one token range.
    assert PageLayout.build((4, 3, 5), 4, 2, 0, 0, 0, 0).first_page == 3
    assert PageLayout.build((5, 3, 4), 4, 2, 0, 0, 0, 0).first_page == -1
    # A gap, or a partly filled page below a full one, breaks the token range.
    assert PageLayout.build((3, 5), 4, 4, 0, 0, 0, 0).first_page == -1
    assert PageLayout.build((4, 3), 4, 2, 0, 0, 0, 0).first_page == -1
    assert PageLayout.build((4, 3), 4, 4, 0, 0, 0, 0).first_page == 3
