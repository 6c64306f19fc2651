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
"""Stopping and abandoning the inference thread of ros/inference/worker.py (threads only, no ROS).

A stop waits a bounded time for the item in progress; an abandoned worker finishes that item by
itself, reports none of its errors, lets go of its handler (what holds the engine session) and
then tells its owner.
"""

import gc
import threading
import weakref

from lingbot_map_ros.ros.inference.worker import FrameQueue, Worker

_TIMEOUT_S = 30.0


class _Handler:
    """A handler object (as the session runner) whose item blocks until released."""

    def __init__(self, fail: bool) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.fail = fail

    def handle(self, item):
        self.started.set()
        self.release.wait(_TIMEOUT_S)
        if self.fail:
            raise RuntimeError(f'item {item} failed after its outputs were destroyed')


def _busy_worker(fail):
    handler, errors = _Handler(fail), []
    queue = FrameQueue(1, block_when_full=False)
    worker = Worker(queue, handler.handle, errors.append)
    worker.start()
    queue.put(1)
    assert handler.started.wait(_TIMEOUT_S)
    return worker, handler, errors


def test_stop_waits_a_bounded_time_then_reports_the_thread_still_running():
    worker, handler, errors = _busy_worker(fail=False)
    assert worker.stop(0.2) is False and worker.running
    handler.release.set()
    assert worker.stop(_TIMEOUT_S) is True and not worker.running
    assert errors == []


def test_an_abandoned_item_fails_silently_frees_its_handler_and_calls_on_exit():
    worker, handler, errors = _busy_worker(fail=True)
    assert worker.stop(0.1) is False
    exited = threading.Event()
    worker.abandon(exited.set)
    owner = weakref.ref(handler)
    release = handler.release
    del handler
    assert not exited.is_set()
    release.set()
    assert exited.wait(_TIMEOUT_S)
    gc.collect()
    assert owner() is None  # the thread let the handler (the session) go
    assert errors == []  # the expected failure of the abandoned item was not reported


def test_an_item_failing_before_abandon_is_still_reported():
    worker, handler, errors = _busy_worker(fail=True)
    handler.release.set()
    assert worker.stop(_TIMEOUT_S) is True
    assert [str(e) for e in errors] == ['item 1 failed after its outputs were destroyed']


def test_abandoning_a_thread_that_already_ended_calls_on_exit_at_once():
    worker, handler, _ = _busy_worker(fail=False)
    handler.release.set()
    assert worker.stop(_TIMEOUT_S) is True
    calls = []
    worker.abandon(lambda: calls.append(threading.current_thread()))
    assert calls == [threading.current_thread()]
