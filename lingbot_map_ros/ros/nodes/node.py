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
"""``lingbot_map_node``: online camera mapping with the LingBot-Map streaming transformer.

Its topics, services and transforms are the table of
:mod:`~lingbot_map_ros.ros.parameters.interface` (``--help`` prints it;
docs/ros_interface.md explains each).

At start the node loads the weights, warms the model up once and starts listening: the
``configure`` and ``activate`` steps of
:class:`~lingbot_map_ros.ros.nodes.node_core.LingbotMapCore`, which ``lingbot_map_lifecycle_node``
runs as transitions. Threads: the executor only queues messages; a worker thread runs inference
(:mod:`~lingbot_map_ros.ros.inference.worker`). The reset service and the diagnostics timer have
their own callback groups, so they answer while a frame is being processed. SIGINT/SIGTERM at any
moment end the process with status 0 (:mod:`~lingbot_map_ros.ros.nodes.node_process`).
Parameters: docs/parameters.md (and below). Frames and scale: docs/odometry.md.
"""

from __future__ import annotations

import sys
from typing import Any

from lingbot_map_ros.ros.nodes import entry
from lingbot_map_ros.ros.nodes.node_core import LingbotMapCore
from lingbot_map_ros.ros.nodes.node_name import NODE_NAME
from rclpy.node import Node

__all__ = ['LingbotMapNode', 'main', 'NODE_NAME']


class LingbotMapNode(Node):
    """Streams camera images through the engine and publishes poses, path, depth and cloud."""

    def __init__(self, **kwargs: Any) -> None:
        """Declare the parameters, then configure and activate the node's parts.

        Args:
            **kwargs: passed to ``rclpy.node.Node`` (e.g. ``parameter_overrides``, ``context``).

        Raises:
            ValueError: an unknown parameter, a bad value, or no weights without
                allow_random_weights.
            WeightsError: the checkpoint does not match the model.
            ImportError: the configured attention backend is not installed.
        """
        super().__init__(NODE_NAME, **kwargs)
        try:
            core = LingbotMapCore(self)
        except BaseException:
            super().destroy_node()
            raise
        self.core = core
        try:
            core.configure()
            core.activate()
        except BaseException:
            self.destroy_node()
            raise

    def destroy_node(self) -> None:
        """Stop the parts (a frame in progress gets a few seconds, then is abandoned)."""
        self.core.shutdown()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the node until SIGINT/SIGTERM (:func:`lingbot_map_ros.ros.nodes.entry.main`).

    Returns:
        Process exit code: 0 on a clean shutdown, 1 when the node could not start.
    """
    return entry.main(args)


if __name__ == '__main__':
    sys.exit(main())
