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
"""One guard for every service and timer callback: an unexpected exception never ends the node.

An exception that leaves an rclpy callback is re-raised by the executor's ``spin`` and stops the
node. :func:`guard_service` wraps a service callback: what it raises is logged at ERROR and
answered (``success`` False and, where the response has one, ``message`` naming the service
and the error). :func:`guard_timer` wraps a timer (or subscription) callback: what it raises is
logged, throttled, and the timer keeps running.

:func:`guard_job` is :func:`guard_service` for a long operation (a map save or load): the work
runs on a thread of its own, one job at a time, and the callback is a coroutine that awaits it,
so the executor's thread is free meanwhile (frames, diagnostics and the other services go on);
the caller gets the answer when the work is done, and ``progress`` is told when it starts and
ends.

:func:`log_outcome` logs a result at INFO or at ERROR from two call sites: rclpy's logger keeps
one severity per call site and raises ``ValueError: Logger severity cannot be changed between
calls.`` when one line logs at two severities (``(log.info if ok else log.error)(...)``).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

from rclpy.task import Future

MAX_ECHO = 400
"""Longest error text put in an answer or a log line (a message may echo file contents)."""

_ERROR_THROTTLE_S = 10.0
"""Least interval between two logs of a failing timer."""

Response = TypeVar('Response')


def bounded(text: str, limit: int = MAX_ECHO) -> str:
    """Return ``text`` cut to ``limit`` characters (with the count of those left out)."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f'{text[:limit]}... ({len(text) - limit} more characters)'


def log_outcome(logger: Any, ok: bool, message: str) -> None:
    """Log ``message`` at INFO when ``ok``, else at ERROR (one call site per severity)."""
    if ok:
        logger.info(message)
    else:
        logger.error(message)


def guard_service(logger: Any, name: str,
                  callback: Callable[[Any, Response], Response]
                  ) -> Callable[[Any, Response], Response]:
    """Return ``callback`` answering instead of raising (module docstring).

    Args:
        logger: the node's logger.
        name: the service's name, as a user calls it (``~/save_map``).
        callback: ``(request, response) -> response``.
    """
    @functools.wraps(callback)
    def answer(request: Any, response: Response) -> Response:
        try:
            return callback(request, response)
        except Exception as exc:  # noqa: BLE001 - answered, the node lives
            reason = bounded(f'{name} failed: {type(exc).__name__}: {exc}')
            logger.error(f'{reason} (unexpected; the node continues)')
            if hasattr(response, 'success'):
                response.success = False
            if hasattr(response, 'message'):
                response.message = reason
            return response
    return answer


def guard_timer(logger: Any, name: str, callback: Callable[..., None]) -> Callable[..., None]:
    """Return ``callback`` logging (throttled) instead of raising; the timer keeps running.

    Also for a subscription's callback (its message is passed on).

    Args:
        logger: the node's logger.
        name: what the callback does, for the log (``map path``, ``/initialpose``).
        callback: the timer's callback (no argument) or a subscription's (the message).
    """
    @functools.wraps(callback)
    def tick(*args: Any) -> None:
        try:
            callback(*args)
        except Exception as exc:  # noqa: BLE001 - a timer must not stop the node
            logger.error(bounded(f'{name} failed: {type(exc).__name__}: {exc}'),
                         throttle_duration_sec=_ERROR_THROTTLE_S)
    return tick


def guard_job(logger: Any, name: str, work: Callable[[Any, Response], Response],
              executor_of: Callable[[], Any], lock: threading.Lock,
              progress: Callable[[str], None]) -> Callable[[Any, Response], Any]:
    """Return a coroutine callback running ``work`` off the executor (module docstring).

    Args:
        logger: the node's logger.
        name: the service's name (``~/save_map``).
        work: ``(request, response) -> response``, run on a thread of its own under ``lock``.
        executor_of: the node's executor (woken when the work ends), None before spinning.
        lock: held while the work runs (one map operation at a time).
        progress: told ``<name>: running`` and then ``<name>: done|refused: <message>``.
    """
    guarded = guard_service(logger, name, work)

    def locked(request: Any, response: Response) -> Response:
        with lock:
            return guarded(request, response)

    async def answer(request: Any, response: Response) -> Response:
        future: Future = Future(executor=executor_of())
        future.add_done_callback(lambda _: None)  # its scheduling wakes the executor

        def run() -> None:
            try:
                future.set_result(locked(request, response))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting callback
                future.set_exception(exc)
        progress(f'{name}: running')
        threading.Thread(target=run, name=f'job{name[1:]}', daemon=True).start()
        try:
            result = await future
        except Exception as exc:  # noqa: BLE001 - answered, the node lives
            reason = bounded(f'{name} failed: {type(exc).__name__}: {exc}')
            logger.error(reason)
            result = response
            if hasattr(result, 'success'):
                result.success = False
            if hasattr(result, 'message'):
                result.message = reason
        ok = getattr(result, 'success', True)
        progress(bounded(f"{name}: {'done' if ok else 'refused'}: "
                         f"{getattr(result, 'message', '')}"))
        return result
    return answer
