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
"""Hand-off between the subscription callback and the inference thread.

The executor thread must never run inference: a 50-500 ms model step inside a callback would
stall every other callback of the node (reset, parameters, diagnostics). The subscription only
puts the raw message into a :class:`FrameQueue`; one :class:`Worker` thread takes items out in
order and runs the handler (conversion, engine step, publishing).

Two queue policies:

- ``live``: capacity 1 by default; a new frame replaces the waiting one, which is counted as
  dropped. The map always works on the newest image, so latency stays bounded when the model is
  slower than the camera.
- ``bag``: every frame is kept in order. When the queue is full, ``put`` blocks the subscription
  callback (backpressure). The DDS reader then buffers up to its history depth, and beyond that
  the middleware drops (best effort) or slows the publisher (reliable), so bag mode is exact only
  with reliable QoS and a history deep enough, or with ``ros2 bag play --rate`` slow enough.
  The offline replay tool is the exact path.

Both are bounded in bytes as well (:data:`MAX_QUEUE_BYTES` of image data): a queue of large
images blocks (bag) or drops its oldest (live, counted as ``queue_overflow``) before it holds
more; one item is always taken, whatever its size (the decoder's limits bound it).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

# How often a blocked put or an idle worker re-checks for shutdown.
_POLL_S = 0.1
LIVE_CAPACITY = 1
"""Frames a single camera's live queue holds (``input.queue_size`` is bag mode's)."""
MAX_QUEUE_BYTES = 512 * 1024 * 1024
"""Image bytes a frame queue holds at most (about 20 frames of 3840x2160 rgb8)."""


def item_bytes(item: Any) -> int:
    """Return the bytes of an item's image data (``item.msg.data``; 0 when it has none)."""
    try:
        return len(item.msg.data)
    except (AttributeError, TypeError):
        return 0


class FrameQueue:
    """Bounded FIFO with a drop-oldest (live) or blocking (bag) policy. Thread safe."""

    def __init__(self, capacity: int, block_when_full: bool,
                 max_bytes: int = MAX_QUEUE_BYTES) -> None:
        """Create an empty queue.

        Args:
            capacity: most items held at once (>= 1).
            block_when_full: True for bag mode (``put`` waits), False for live mode (``put``
                drops the oldest item).
            max_bytes: most image bytes held at once (:func:`item_bytes`; one item always fits).

        Raises:
            ValueError: capacity below 1.
        """
        if capacity < 1:
            raise ValueError(f'queue capacity must be >= 1, got {capacity}')
        self._items: collections.deque[Any] = collections.deque()
        self._capacity = capacity
        self._max_bytes = int(max_bytes)
        self._bytes = 0
        self._block = block_when_full
        self._cond = threading.Condition()
        self._closed = False

    @property
    def num_bytes(self) -> int:
        """Return the image bytes waiting now."""
        with self._cond:
            return self._bytes

    def _full_for(self, size: int) -> bool:
        """Return True when an item of ``size`` bytes does not fit now (hold the lock)."""
        return len(self._items) >= self._capacity or (
            bool(self._items) and self._bytes + size > self._max_bytes)

    def _append(self, item: Any, size: int) -> None:
        self._items.append(item)
        self._bytes += size
        self._cond.notify_all()

    def _pop(self, index: int = 0) -> Any:
        item = self._items[index]
        del self._items[index]
        self._bytes -= item_bytes(item)
        return item

    def put(self, item: Any) -> int:
        """Add an item at the back.

        Returns:
            Number of older items dropped to make room (always 0 in blocking mode, and 0 when
            the queue is closed, in which case the item is discarded).
        """
        size = item_bytes(item)
        with self._cond:
            if self._block:
                while self._full_for(size) and not self._closed:
                    self._cond.wait(_POLL_S)
            if self._closed:
                return 0
            dropped = 0
            while self._full_for(size):
                self._pop()
                dropped += 1
            self._append(item, size)
            return dropped

    def get(self, timeout_s: float) -> Any | None:
        """Take the front item, waiting up to ``timeout_s``.

        Returns:
            The item, or None on timeout or when the queue is closed and empty.
        """
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait(timeout_s)
            if not self._items:
                return None
            item = self._pop()
            self._cond.notify_all()
            return item

    def clear(self) -> int:
        """Drop every waiting item and return how many there were."""
        with self._cond:
            count = len(self._items)
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
            return count

    def close(self) -> None:
        """Wake every waiter; later puts are discarded."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        """Return the number of waiting items."""
        with self._cond:
            return len(self._items)


class Worker:
    """One thread that feeds queue items to a handler until stopped (or abandoned)."""

    def __init__(self, queue: FrameQueue, handler: Callable[[Any], None],
                 on_error: Callable[[BaseException], None], name: str = 'lingbot_map_worker'
                 ) -> None:
        """Prepare (not start) the thread.

        Args:
            queue: where items come from.
            handler: called with each item on the worker thread.
            on_error: called with any exception the handler lets escape; the loop goes on.
            name: thread name (shows in py-spy and gdb).
        """
        self._queue = queue
        self._handler: Callable[[Any], None] | None = handler
        self._on_error: Callable[[BaseException], None] | None = on_error
        self._stop = threading.Event()
        self._exit_lock = threading.Lock()
        self._on_exit: Callable[[], None] | None = None
        self._ended = False
        # A daemon thread: a frame stuck in the engine must never keep the process alive (the
        # process exits through os._exit then, see node_process.py).
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    @property
    def running(self) -> bool:
        """Return True while the thread is alive (a stopped worker may still finish a frame)."""
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Close the queue, let the current item finish and join the thread.

        Args:
            timeout_s: longest wait for the current item to finish.

        Returns:
            True if the thread ended within the timeout; otherwise it ends by itself after its
            current item (call :meth:`abandon` to detach it from the handler's owner).
        """
        self._stop.set()
        self._queue.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(max(timeout_s, 0.0))
        return not self._thread.is_alive()

    def abandon(self, on_exit: Callable[[], None]) -> None:
        """Give up a stopped worker whose item is still running.

        From now on an exception of that item is not reported through ``on_error``: the owner
        has destroyed what the item writes to, so it is expected to fail. The thread drops its
        handler and error callback as it ends, then calls ``on_exit``, so the owner can free what
        the item held. ``on_exit`` runs at once, on the caller's thread, if the thread has
        already ended.
        """
        self._stop.set()
        self._queue.close()
        with self._exit_lock:
            if not self._ended:
                self._on_exit = on_exit
                return
        on_exit()

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self._queue.get(_POLL_S)
            if item is None or self._stop.is_set():
                continue
            try:
                self._handler(item)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any bad frame
                self._report(exc)
            del item
        # The handler holds the engine session: let it go with the thread.
        self._handler = None
        with self._exit_lock:
            self._ended = True
            on_exit, self._on_error = self._on_exit, None
        if on_exit is not None:
            on_exit()

    def _report(self, exc: Exception) -> None:
        with self._exit_lock:
            on_error = None if self._on_exit is not None else self._on_error
        if on_error is not None:
            on_error(exc)
