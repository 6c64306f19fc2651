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
"""PagePool: allocation, ownership, errors, and a long random run against a set model.

Run: ``python -m pytest test/engine/test_page_pool.py`` (repo root; CPU only, < 1 s).
"""

import random

from lingbot_map_ros.engine.cache.page_pool import NO_FRAME, PagePool
from lingbot_map_ros.engine.errors import CachePoolExhaustedError, CacheStateError
import pytest


def test_allocate_any_takes_highest_free_first_and_counts():
    pool = PagePool(4, 'patch')
    assert (pool.num_pages, pool.num_free, pool.num_used) == (4, 4, 0)
    assert pool.allocate(frame=0) == 3
    assert pool.allocate(frame=1) == 2
    assert (pool.num_free, pool.num_used) == (2, 2)
    assert pool.owner(3) == 0 and pool.owner(2) == 1 and pool.owner(0) == NO_FRAME
    assert not pool.is_free(3) and pool.is_free(1)


def test_allocate_specific_page_then_any_skips_it():
    pool = PagePool(5)
    assert pool.allocate(frame=7, page_id=4) == 4
    assert pool.allocate(frame=8, page_id=0) == 0
    # Pages 1..3 are left; taking them all must give exactly those ids.
    assert sorted(pool.allocate(frame=9) for _ in range(3)) == [1, 2, 3]
    with pytest.raises(CachePoolExhaustedError, match='all 5 pages'):
        pool.allocate(frame=10)


def test_errors_name_the_state():
    pool = PagePool(3, 'special')
    pool.allocate(frame=2, page_id=1)
    with pytest.raises(CacheStateError, match='page 1 is already used by frame 2'):
        pool.allocate(frame=3, page_id=1)
    pool.free(1)
    with pytest.raises(CacheStateError, match='page 1 is freed twice'):
        pool.free(1)
    with pytest.raises(ValueError, match=r'outside \[0, 3\)'):
        pool.allocate(frame=0, page_id=3)
    with pytest.raises(ValueError, match='frame=-1'):
        pool.allocate(frame=-1)
    with pytest.raises(CacheStateError, match='reassign free page 0'):
        pool.reassign(0, 5)
    with pytest.raises(ValueError):
        PagePool(-1)


def test_reassign_and_reset():
    pool = PagePool(3)
    pool.allocate(frame=1, page_id=2)
    pool.reassign(2, 6)
    assert pool.owner(2) == 6
    pool.reset()
    assert pool.num_free == 3 and pool.owner(2) == NO_FRAME
    assert pool.allocate(frame=0) == 2


def test_random_operations_match_a_set_model():
    rng = random.Random(1234)
    num_pages = 17
    pool = PagePool(num_pages)
    used: dict[int, int] = {}
    for step in range(5000):
        op = rng.random()
        if op < 0.35:
            if len(used) == num_pages:
                with pytest.raises(CachePoolExhaustedError):
                    pool.allocate(frame=step)
                continue
            page = pool.allocate(frame=step)
            assert page not in used
            used[page] = step
        elif op < 0.55:
            page = rng.randrange(num_pages)
            if page in used:
                with pytest.raises(CacheStateError):
                    pool.allocate(frame=step, page_id=page)
            else:
                assert pool.allocate(frame=step, page_id=page) == page
                used[page] = step
        elif op < 0.98:
            if used:
                page = rng.choice(sorted(used))
                pool.free(page)
                del used[page]
        else:
            pool.reset()
            used.clear()
        assert pool.num_used == len(used)
        assert pool.num_free == num_pages - len(used)
        for page in range(num_pages):
            assert pool.owner(page) == used.get(page, NO_FRAME)
