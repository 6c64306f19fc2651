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
"""One node process from ``rclpy.init`` to exit, and its orderly, bounded shutdown.

rclpy starts without its signal handlers (:mod:`~lingbot_map_ros.ros.nodes.process_signals` has
ours), so nothing is shut down under a running callback. The main thread spins the executor in
short turns and checks the flag between them. On SIGINT/SIGTERM it stops, in this order:

1. no more callbacks start (the spin loop ends);
2. the node's parts stop (``LingbotMapCore.shutdown``): inputs unsubscribed, the inference thread
   told to stop, at most ``_WORKER_WAIT_S`` for the frame in progress, publishers destroyed;
3. the executor shuts down (its threads joined), at most until ``_SHUTDOWN_BUDGET_S`` after the
   signal;
4. the node is destroyed, then the context (which also flushes the ROS log files).

If all of that finished, the process returns 0 through the normal interpreter exit. If the
inference thread is still inside a frame (a frame longer than the wait, a hung GPU) or a
callback did not end in time, the normal exit is not safe: the interpreter would finalise while
that thread is inside torch's C++ code and the process would abort (``terminate called without
an active exception``), or it would wait for the thread past ros2 launch's 5 s. Then, and only
then, stdout and stderr are flushed and the process ends with ``os._exit(0)`` from the main
thread: a documented last resort that runs no further Python or C++ clean-up, which nothing needs
(outputs are gone, files are closed, the log is flushed).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from lingbot_map_ros.engine.errors import WeightsError
from lingbot_map_ros.ros.nodes.node_name import NODE_NAME
from lingbot_map_ros.ros.nodes.process_signals import ProcessSignals, ShutdownRequested
from lingbot_map_ros.ros.parameters import cli_help, cli_params
import rclpy
from rclpy.exceptions import ParameterException
from rclpy.executors import MultiThreadedExecutor
from rclpy.signals import SignalHandlerOptions

# ros2 launch sends SIGTERM 5 s after its SIGINT: everything below fits in that.
_SHUTDOWN_BUDGET_S = 4.0
# Longest wait for the frame in progress (part of the budget).
_WORKER_WAIT_S = 3.0
# How often the main thread looks at the signal flag between executor turns.
_POLL_S = 0.1
_EXECUTOR_THREADS = 4
# Start-up errors that end the process with one FATAL line (no traceback).
_START_ERRORS = (ValueError, ImportError, WeightsError, OSError, ParameterException)


def run(args: list[str] | None, node_class: type, exe: str, signals: ProcessSignals) -> int:
    """Run ``node_class`` until SIGINT/SIGTERM (or the context ends), then stop it in order.

    Args:
        args: command line (``sys.argv`` when None).
        node_class: a node class whose instances have a ``core``
            (:class:`~lingbot_map_ros.ros.nodes.node_core.LingbotMapCore`).
        exe: executable name, for ``--help``.
        signals: the installed handlers, still in their start-up phase.

    Returns:
        0 after a clean shutdown, 1 when the node could not start. May not return: see the
        module docstring for the ``os._exit(0)`` of a shutdown that could not finish in time.

    Raises:
        ShutdownRequested: a signal during start-up (the caller exits with 0).
    """
    if cli_help.wants_help(sys.argv[1:] if args is None else args[1:]):
        try:
            print(cli_help.help_text(exe, sys.modules[node_class.__module__].__doc__),
                  flush=True)
        except BrokenPipeError:  # `--help | head`: the reader has gone; not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    for ignored in cli_params.params_file_problems(sys.argv if args is None else args,
                                                   NODE_NAME):
        rclpy.logging.get_logger(NODE_NAME).warning(ignored)
    problem = cli_params.type_problem(sys.argv if args is None else args, NODE_NAME)
    if problem:  # rcl would drop it silently where a --params-file sets the name too
        _fatal(problem)
        return 1
    # Explicit init/shutdown rather than `with rclpy.init()`, which only newer rclpy has
    # (Jazzy robots run this node too).
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except Exception as exc:  # noqa: BLE001 - e.g. a bad --params-file: one line, no trace
        _fatal(str(exc).strip().splitlines()[-1])
        return 1
    node = None
    try:
        try:
            node = node_class()
        except Exception as exc:
            if signals.requested:
                # The start-up signal's exception can land inside a library's bookkeeping
                # (rclpy's entity lists); unwinding the half-made node may then fail on it. It
                # is still the shutdown that was asked for, not a start-up error.
                raise ShutdownRequested(signals.received) from exc
            if not isinstance(exc, _START_ERRORS):
                raise
            _fatal(str(exc))
            return 1
        signals.running()
        executor = MultiThreadedExecutor(num_threads=_EXECUTOR_THREADS)
        executor.add_node(node)
        while not signals.requested and rclpy.ok():
            executor.spin_once(timeout_sec=_POLL_S)
        node.get_logger().info(f'{signals.received or "context shut down"}: stopping the node')
        if not _stop(node, executor):
            _exit_now()
        node = None
        return 0
    finally:
        if node is not None:  # start-up interrupted, or an error: no executor work is left
            node.destroy_node()
        rclpy.try_shutdown()


def _stop(node: Any, executor: MultiThreadedExecutor) -> bool:
    """Stop the node's parts, the executor, the node and the context, in that order.

    Returns:
        True when everything ended; False when a frame or a callback is still running.
    """
    deadline = time.monotonic() + _SHUTDOWN_BUDGET_S
    finished = node.core.shutdown(_WORKER_WAIT_S)
    finished = _bounded(executor.shutdown, deadline - time.monotonic()) and finished
    if not finished:
        node.get_logger().warning('exiting without waiting for the work still running')
    node.destroy_node()
    rclpy.try_shutdown()
    return finished


def _bounded(call: Callable[[], Any], timeout_s: float) -> bool:
    """Run ``call`` on a helper thread; return whether it ended within ``timeout_s``."""
    thread = threading.Thread(target=call, name='lingbot_map_shutdown', daemon=True)
    thread.start()
    thread.join(max(timeout_s, 0.1))
    return not thread.is_alive()


def _exit_now() -> None:
    """End the process at once with status 0, after flushing what is buffered (last resort)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to flush
            pass
    os._exit(0)


def _fatal(message: str) -> None:
    rclpy.logging.get_logger(NODE_NAME).fatal(f'cannot start: {message}')
