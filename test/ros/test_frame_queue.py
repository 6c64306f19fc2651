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
"""FrameQueue (live: drop oldest; bag: block) and the Worker thread of ros/inference/worker.py.

Run: ``pytest test/ros/test_frame_queue.py`` (about a second; threads only, no ROS graph).
"""

import threading
import time

from lingbot_map_ros.ros.inference.worker import FrameQueue, Worker
import pytest


def test_live_queue_keeps_the_newest_and_counts_drops():
    queue = FrameQueue(1, block_when_full=False)
    assert [queue.put(i) for i in range(5)] == [0, 1, 1, 1, 1]
    assert queue.get(0.01) == 4
    assert queue.get(0.01) is None


def test_bag_queue_blocks_until_there_is_room_and_keeps_order():
    queue = FrameQueue(2, block_when_full=True)
    queue.put('a')
    queue.put('b')
    done = threading.Event()

    def producer():
        queue.put('c')
        done.set()
    threading.Thread(target=producer, daemon=True).start()
    assert not done.wait(0.3)  # full: the producer waits (backpressure)
    assert queue.get(0.1) == 'a'
    assert done.wait(2.0)
    assert [queue.get(0.1), queue.get(0.1)] == ['b', 'c']


def test_close_releases_a_blocked_producer_and_discards():
    queue = FrameQueue(1, block_when_full=True)
    queue.put(1)
    released = threading.Event()
    threading.Thread(target=lambda: (queue.put(2), released.set()), daemon=True).start()
    time.sleep(0.1)
    queue.close()
    assert released.wait(2.0)
    assert queue.put(3) == 0 and len(queue) == 1
    assert queue.clear() == 1


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match='capacity'):
        FrameQueue(0, block_when_full=False)


def test_worker_survives_handler_errors_and_joins():
    queue = FrameQueue(10, block_when_full=True)
    seen, errors = [], []

    def handler(item):
        if item == 'bad':
            raise RuntimeError('boom')
        seen.append(item)
    worker = Worker(queue, handler, errors.append)
    worker.start()
    for item in ('a', 'bad', 'b'):
        queue.put(item)
    deadline = time.monotonic() + 5.0
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == ['a', 'b']
    assert [str(e) for e in errors] == ['boom']
    assert worker.stop(timeout_s=2.0)


def test_worker_stop_waits_for_the_item_in_progress():
    queue = FrameQueue(1, block_when_full=False)
    finished = []
    started = threading.Event()

    def slow(item):
        started.set()
        time.sleep(0.3)
        finished.append(item)
    worker = Worker(queue, slow, lambda exc: None)
    worker.start()
    queue.put('x')
    assert started.wait(2.0)
    assert worker.stop(timeout_s=5.0)
    assert finished == ['x']
