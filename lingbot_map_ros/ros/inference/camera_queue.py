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
"""CameraQueue: the frame queue of several cameras, and the frames of a group taken in sync.

The worker's queue (``worker.FrameQueue``) with two changes for ``input.cameras``: in live
mode it keeps the newest frame of each camera (not the newest frame), and
:meth:`CameraQueue.take_synced` takes the waiting frames of the other cameras stamped within
``input.sync_tolerance_s`` of a frame, the group ``camera_group.CameraGroup`` feeds together.
"""

from __future__ import annotations

import collections
from typing import Callable

from lingbot_map_ros.ros.inference.session_runner import InputFrame
from lingbot_map_ros.ros.inference.worker import FrameQueue, item_bytes, MAX_QUEUE_BYTES
from lingbot_map_ros.ros.messages import conversions


class CameraQueue(FrameQueue):
    """The frame queue of several cameras: live mode keeps the newest frame of each camera.

    Bounded in bytes too (``worker.MAX_QUEUE_BYTES``): in live mode, when the newest frames of
    all cameras hold more, the oldest waiting frames of other cameras are dropped, each counted
    on its own camera through ``count_overflow``.
    """

    def __init__(self, num_cameras: int, capacity: int, block_when_full: bool,
                 max_bytes: int = MAX_QUEUE_BYTES,
                 count_overflow: Callable[[str, int], None] | None = None) -> None:
        """Create an empty queue (live: one frame per camera; bag: ``capacity`` frames)."""
        super().__init__(capacity if block_when_full else num_cameras, block_when_full,
                         max_bytes)
        self._count_overflow = count_overflow

    def put(self, item: InputFrame) -> int:
        """Add a frame; in live mode it replaces the waiting frame of its camera (returns 1).

        Returns:
            The frames of ``item``'s camera dropped for it; frames of other cameras dropped to
            stay within the byte bound are counted through ``count_overflow``.
        """
        if self._block:
            return super().put(item)
        size = item_bytes(item)
        others: collections.Counter = collections.Counter()
        with self._cond:
            if self._closed:
                return 0
            old = [k for k, i in enumerate(self._items) if i.camera == item.camera]
            for k in reversed(old):
                self._pop(k)
            while self._items and self._bytes + size > self._max_bytes:
                others[self._pop().camera] += 1
            self._append(item, size)
        if self._count_overflow is not None:
            for camera, num in others.items():
                self._count_overflow(camera, num)
        return len(old)

    def take_synced(self, first: InputFrame, tolerance_ns: int) -> list[InputFrame]:
        """Take the waiting frames of other cameras that are in sync with ``first``.

        Only the oldest waiting frame of each camera is considered, so every camera's frames
        stay in order.
        """
        stamp = _stamp(first)
        if stamp is None:
            return []
        taken: list[InputFrame] = []
        with self._cond:
            seen = {first.camera}
            for item in list(self._items):
                if item.camera in seen:
                    continue
                seen.add(item.camera)
                other = _stamp(item)
                if other is not None and abs(other - stamp) <= tolerance_ns:
                    taken.append(item)
            for item in taken:
                self._pop(next(k for k, i in enumerate(self._items) if i is item))
            if taken:
                self._cond.notify_all()
        return taken


def _stamp(item: InputFrame) -> int | None:
    try:
        return conversions.stamp_to_ns(item.msg.header.stamp)
    except (conversions.InvalidStampError, AttributeError):
        return None
