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
"""Forward the engine's Python ``logging`` records to the node's ROS logger.

The engine logs with ``logging.getLogger(__name__)`` (it must not import rclpy). Without this
bridge its records would bypass ``/rosout`` and the launch log files, and INFO records (such as the
KV cache size logged at start-up) would not show at all.
"""

from __future__ import annotations

import logging
from typing import Any

_PACKAGE_LOGGER = 'lingbot_map_ros'


class RosLogHandler(logging.Handler):
    """A ``logging.Handler`` that writes to an rclpy logger."""

    def __init__(self, ros_logger: Any) -> None:
        """Wrap ``ros_logger`` (the node's ``get_logger()``)."""
        super().__init__(level=logging.INFO)
        self._ros_logger = ros_logger

    def emit(self, record: logging.LogRecord) -> None:
        """Write one record at the matching ROS severity."""
        try:
            message = f'[{record.name}] {self.format(record)}'
            if record.levelno >= logging.ERROR:
                self._ros_logger.error(message)
            elif record.levelno >= logging.WARNING:
                self._ros_logger.warning(message)
            else:
                self._ros_logger.info(message)
        except Exception:  # noqa: BLE001 - logging must never raise into the engine
            self.handleError(record)


def attach(ros_logger: Any) -> RosLogHandler:
    """Route ``lingbot_map_ros.*`` records at INFO and above to ``ros_logger``.

    Returns:
        The handler, for :func:`detach`.
    """
    handler = RosLogHandler(ros_logger)
    package = logging.getLogger(_PACKAGE_LOGGER)
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    # Records reach ROS through the handler; without this they would also print a second time
    # through Python's last-resort stderr handler.
    package.propagate = False
    return handler


def detach(handler: RosLogHandler) -> None:
    """Undo :func:`attach`."""
    package = logging.getLogger(_PACKAGE_LOGGER)
    package.removeHandler(handler)
    if not package.handlers:
        package.propagate = True
