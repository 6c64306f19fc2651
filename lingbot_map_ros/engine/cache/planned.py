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
"""planned: begin a call's cache work on every stream of it, end it on all, or roll all back.

A call (one stream's frames, or one frame of each of several streams) plans its cache work
before the first layer (``StreamKV.plan_frame``, or a staged frame: ``StagedFrames.stage_frame``)
and ends it after the last. When anything in between raises, every stream that began is rolled
back (``failed=True``) and no other is touched, so a refused batch leaves each stream as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import contextlib
from typing import TypeVar

T = TypeVar('T')

Begin = tuple[Callable[[], T], Callable[[T, bool], None]]
"""``(begin, end)``: ``begin()`` plans one stream's work; ``end(plan, failed)`` ends it."""


@contextlib.contextmanager
def planned(work: Sequence[Begin]) -> Iterator[list]:
    """Begin every item of ``work`` in order; end them all after the block, or roll back.

    Yields:
        The plans, in ``work``'s order.
    """
    plans: list = []
    try:
        for begin, _ in work:
            plans.append(begin())
        yield plans
    except BaseException:
        for (_, end), plan in zip(work, plans):
            end(plan, True)
        raise
    for (_, end), plan in zip(work, plans):
        end(plan, False)
