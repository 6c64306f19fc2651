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
"""SIGINT and SIGTERM of the node processes, handled by us rather than by rclpy.

rclpy's own handlers shut the context down from the signal, at once, while the executor's
threads and the inference thread may still be publishing: those then fail with ``RCLError`` (a
traceback, exit 1), and a frame still inside torch when the interpreter finalises aborts the
process (``terminate called without an active exception``). The node processes therefore start
rclpy without its handlers and install these, which only decide *when* to stop; what stopping
means is in :mod:`~lingbot_map_ros.ros.nodes.node_process`.

Three phases:

- **imports** (torch, rclpy and the node's modules, inside :meth:`ProcessSignals.importing`):
  nothing has started yet that needs stopping, and an exception raised inside a C extension's
  initialisation could abort the process; the first signal ends the process at once with
  status 0 (``os._exit`` after flushing stdout and stderr). Waiting for the imports to end
  instead costs up to the whole torch import (seconds; 18 s with two test suites at once);
- **start-up** (loading the weights, the warm-up; all on the main thread): the first signal
  raises :class:`ShutdownRequested` there, so start-up unwinds through its ``finally`` blocks
  and the process exits with status 0;
- **running** (after :meth:`ProcessSignals.running`): a signal only sets a flag; the main thread
  polls it between executor turns and stops the node in order.

Further signals while stopping are ignored, up to the end of the process: the stop is bounded
already (ros2 launch's SIGTERM five seconds after its SIGINT finds the process gone), and a
second Ctrl-C changes nothing of it. After the node has stopped, :meth:`ProcessSignals.finish`
sets SIGINT and SIGTERM to "ignore" (``SIG_IGN``) rather than giving back the previous handlers:
the interpreter's exit resets Python-level handlers to the system default, and the exit of a
process that has loaded torch and DDS takes about a second, in which a second signal would
otherwise kill the process by the signal (status -2) instead of its clean status 0.

This module imports nothing heavy, so the handlers are in place within a fraction of a second
of the process start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ShutdownRequested(BaseException):
    """Raised on the main thread by the first SIGINT/SIGTERM during start-up.

    A ``BaseException`` (as ``KeyboardInterrupt``), so the ``except Exception`` blocks of the
    libraries being imported or loading do not swallow it.
    """


class ProcessSignals:
    """The handlers of SIGINT and SIGTERM for one process run (main thread only)."""

    def __init__(self) -> None:
        """Prepare (not install) the handlers, in the start-up phase."""
        self._requested = threading.Event()
        self._running = False
        self._importing = False
        self._saved: dict[int, Any] = {}
        self.received: str | None = None
        """Name of the first signal received (``'SIGINT'``), None before."""

    def install(self) -> None:
        """Install the handlers; the previous ones come back with :meth:`uninstall`.

        Off the main thread (an embedding program running ``main`` in a thread) Python allows
        no handlers: nothing is installed and the embedding program stops the node.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            self._saved[sig] = signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        """Restore the handlers that were in place before :meth:`install`."""
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def finish(self) -> None:
        """End of the run: what follows the handlers depends on whether a signal stopped it.

        After a SIGINT/SIGTERM the process is exiting: both signals are ignored from here to its
        end (see the module docstring). Without one (an embedding program's run that ended, a
        start-up error), the handlers in place before :meth:`install` come back.
        """
        if not self._requested.is_set():
            self.uninstall()
            return
        for sig in self._saved:
            signal.signal(sig, signal.SIG_IGN)
        self._saved.clear()

    def running(self) -> None:
        """End the start-up phase: from now on a signal only sets :attr:`requested`."""
        self._running = True

    @contextlib.contextmanager
    def importing(self) -> Iterator[None]:
        """Mark the native imports: a signal inside this block ends the process at once.

        Exit status 0 through ``os._exit`` (see the module docstring); outside the main thread,
        where no handler is installed, the block does nothing.
        """
        self._importing = True
        try:
            yield
        finally:
            self._importing = False

    @property
    def requested(self) -> bool:
        """Return True once SIGINT or SIGTERM was received."""
        return self._requested.is_set()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._requested.is_set():
            return
        self.received = signal.Signals(signum).name
        self._requested.set()
        if self._importing:
            _exit_now()
        if not self._running:
            raise ShutdownRequested(self.received)


def _exit_now() -> None:
    """End the process with status 0 at once, after flushing what is buffered."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to flush
            pass
    os._exit(0)
