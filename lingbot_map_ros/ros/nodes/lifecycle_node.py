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
"""``lingbot_map_lifecycle_node``: the same node as a managed (lifecycle) node, nav2 style.

Transitions (``ros2 lifecycle set /lingbot_map <transition>``, or a lifecycle manager), each the
step of the same name of :class:`~lingbot_map_ros.ros.nodes.node_core.LingbotMapCore`:

- ``configure``: read the parameters, load the weights and warm the model up once with gray
  frames of ``stream.image_width`` (4:3), so the first camera frames are not the slow ones;
  create the output publishers, ``/diagnostics`` and the services.
- ``activate``: subscribe to the image and camera_info topics and start the inference thread.
- ``deactivate``: unsubscribe and stop the thread; a frame in progress gets 3 s, then finishes in
  the background. The map (cache) is kept: activating again continues the same session.
- ``cleanup``: destroy the publishers and the session and free its memory
  (``torch.cuda.empty_cache``); a frame still running after 3 s is abandoned (nothing of it is
  published, its memory is freed when it ends). ``shutdown`` does what is still needed of the
  above.

Topics, services, transforms and parameters are those of ``lingbot_map_node`` (listed below):
the publishers and services exist from ``configure``, the subscriptions from ``activate``;
parameters can be set before ``configure``. The launch file starts this executable with
``lifecycle:=true``.
"""

from __future__ import annotations

import sys
from typing import Any

from lingbot_map_ros.engine.errors import WeightsError
from lingbot_map_ros.ros.nodes import entry
from lingbot_map_ros.ros.nodes.node_name import NODE_NAME
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

# What a failed configure raises (bad parameters or weights, a missing backend); the node then
# stays unconfigured and says why.
_CONFIGURE_ERRORS = (ValueError, ImportError, WeightsError, OSError, RuntimeError)


class LingbotMapLifecycleNode(LifecycleNode):
    """``lingbot_map_node`` with configure/activate/deactivate/cleanup transitions."""

    def __init__(self, **kwargs: Any) -> None:
        """Declare the parameters only; nothing is loaded before ``configure``.

        Args:
            **kwargs: passed to ``rclpy.lifecycle.LifecycleNode`` (``parameter_overrides``...).

        Raises:
            ValueError: an unknown parameter or a bad value (the process exits with a FATAL).
        """
        # Imported here, not at the top: the core pulls in torch (seconds), and the console
        # script imports this module before main() installs the signal handlers.
        from lingbot_map_ros.ros.nodes.node_core import LingbotMapCore

        super().__init__(NODE_NAME, **kwargs)
        try:
            self.core = LingbotMapCore(self)
        except BaseException:
            # Destroyed here: the context would otherwise destroy a node without a core at
            # shutdown (an AttributeError traceback after the FATAL line).
            super().destroy_node()
            raise

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load the weights, warm up, create the outputs, diagnostics and ``~/reset``."""
        try:
            self.core.configure()
        except _CONFIGURE_ERRORS as exc:
            self.get_logger().error(f'configure failed: {type(exc).__name__}: {exc}')
            return TransitionCallbackReturn.FAILURE
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start the inference thread and subscribe to the inputs."""
        self.core.activate()
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Unsubscribe and stop the thread after the frame in progress; the map is kept."""
        self.core.deactivate()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Destroy the outputs and the session; free the memory."""
        self.core.cleanup()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Release everything whatever the state."""
        self.core.cleanup()
        return TransitionCallbackReturn.SUCCESS

    def destroy_node(self) -> None:
        """Release the parts, then destroy the node."""
        self.core.shutdown()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the lifecycle node until SIGINT/SIGTERM; it waits unconfigured for its transitions.

    Returns:
        Process exit code: 0 on a clean shutdown, 1 when the node could not start.
    """
    return entry.run(args, 'lingbot_map_lifecycle_node', __name__, 'LingbotMapLifecycleNode')


if __name__ == '__main__':
    sys.exit(main())
