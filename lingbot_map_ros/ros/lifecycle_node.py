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

Transitions (``ros2 lifecycle set /lingbot_map <transition>``, or a lifecycle manager):

- ``configure``: read the parameters, load the weights and warm the model up with gray frames of
  ``stream.image_width`` (4:3; the scale frames and one streaming frame), so the first camera
  frames are not the slow ones; create the output publishers, ``/diagnostics`` and ``~/reset``.
- ``activate``: subscribe to the image and camera_info topics and start the inference thread.
- ``deactivate``: unsubscribe, finish the frame in progress, stop the thread. The map (cache) is
  kept: activating again continues the same session.
- ``cleanup``: destroy the publishers and the session and free its GPU memory
  (``torch.cuda.empty_cache``). ``shutdown`` does what is still needed of the above.

Topics, parameters and frames are those of :mod:`~lingbot_map_ros.ros.node`; parameters can be
set before ``configure``. The launch file starts this executable with ``lifecycle:=true``.
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

from lingbot_map_ros.engine.errors import WeightsError
from lingbot_map_ros.ros import logging_bridge, params
from lingbot_map_ros.ros.node import LingbotMapNode, main as node_main, NODE_NAME
import numpy as np
from rclpy.clock import JumpThreshold
from rclpy.duration import Duration
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
import torch

# Errors that make configure fail (the node stays unconfigured and says why).
_CONFIG_ERRORS = (ValueError, ImportError, WeightsError, OSError, RuntimeError)


class LingbotMapLifecycleNode(LifecycleNode):
    """``lingbot_map_node`` with configure/activate/deactivate/cleanup transitions."""

    # The plain node's building blocks and callbacks work unchanged here: they only use the
    # attributes that on_configure / on_activate set (same names as in LingbotMapNode).
    _build_engine = LingbotMapNode._build_engine
    _make_worker = LingbotMapNode._make_worker
    _make_session = LingbotMapNode._make_session
    _raw_converter = staticmethod(LingbotMapNode._raw_converter)
    _create_inputs = LingbotMapNode._create_inputs
    _create_services = LingbotMapNode._create_services
    _create_diagnostics_timer = LingbotMapNode._create_diagnostics_timer
    _log_startup = LingbotMapNode._log_startup
    _on_image = LingbotMapNode._on_image
    _on_camera_info = LingbotMapNode._on_camera_info
    _on_worker_error = LingbotMapNode._on_worker_error
    _on_reset = LingbotMapNode._on_reset
    _publish_diagnostics = LingbotMapNode._publish_diagnostics
    _diagnostics = LingbotMapNode._diagnostics
    _validate_parameters = LingbotMapNode._validate_parameters

    def __init__(self, **kwargs: Any) -> None:
        """Declare the parameters only; nothing is loaded before ``configure``.

        Args:
            **kwargs: passed to ``rclpy.lifecycle.LifecycleNode`` (``parameter_overrides``...).
        """
        super().__init__(NODE_NAME, **kwargs)
        self._log_handler = logging_bridge.attach(self.get_logger())
        self._values = params.declare_all(self)
        self._session: Any = None
        self._inputs: list[Any] = []
        self._worker: Any = None
        self.add_on_set_parameters_callback(self._validate_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)
        # Sim time going backwards (bag loop) invalidates the map, as in the plain node.
        self._jump_handle = self.get_clock().create_jump_callback(
            JumpThreshold(min_forward=None, min_backward=Duration(nanoseconds=-1)),
            post_callback=self._on_clock_jump)

    def _on_clock_jump(self, _jump: Any) -> None:
        runner = getattr(self, '_runner', None)
        if runner is not None:
            runner.request_reset('clock_jump')

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load the weights, warm up, create the outputs, diagnostics and ``~/reset``."""
        try:
            config, has_bridge = self._build_engine()
            self._warm_up(config)
        except _CONFIG_ERRORS as exc:
            self.get_logger().error(f'configure failed: {type(exc).__name__}: {exc}')
            self._destroy_interfaces()  # what _build_engine created before the failure
            self._release_engine()
            return TransitionCallbackReturn.FAILURE
        self._create_services()
        self._queue, self._worker = self._make_worker()
        self._topic = ''  # known once the inputs exist (activate)
        self._startup = (config, has_bridge)
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Subscribe to the inputs and start the inference thread."""
        if self._worker is None:  # after a deactivate: a thread cannot be started twice
            self._queue, self._worker = self._make_worker()
        self._worker.start()
        self._inputs = self._create_inputs()
        self._log_startup(*self._startup)
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Unsubscribe and stop the thread after the frame in progress; the map is kept."""
        self._stop_inputs()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Destroy the outputs and the session; free the GPU memory."""
        self._stop_inputs()
        self._destroy_interfaces()
        self._release_engine()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Release everything whatever the state."""
        return self.on_cleanup(state)

    def _warm_up(self, config: Any) -> None:
        # Gray frames through both phases of the pipeline (the scale frames run together, then
        # one streaming frame): weights on the device, kernels chosen, CUDA graphs captured where
        # enabled. Then a reset, so the map starts with the first camera frame.
        width = config.stream.image_width
        frame = np.full((width * 3 // 4, width, 3), 128, np.uint8)
        start = time.monotonic()
        for i in range(config.cache.scale_frames + 1):
            self._session.step(frame, (i + 1) * 100_000_000)
        self._session.reset()
        self.get_logger().info(f'warmed up in {time.monotonic() - start:.1f} s')

    def _stop_inputs(self) -> None:
        for sub in self._inputs:
            self.destroy_subscription(sub)
        self._inputs = []
        if self._worker is not None and not self._worker.stop():
            self.get_logger().warning('worker did not finish its frame within 10 s')
        self._worker = None

    def _destroy_interfaces(self) -> None:
        for name, destroy in (('_diag_timer', self.destroy_timer),
                              ('_diag_pub', self.destroy_publisher),
                              ('_reset_srv', self.destroy_service)):
            if getattr(self, name, None) is not None:
                destroy(getattr(self, name))
                setattr(self, name, None)
        outputs = getattr(self, '_outputs', None)
        if outputs is not None:
            outputs.destroy()
            self._outputs = None
        map_output = getattr(self, '_map', None)
        if map_output is not None:
            map_output.destroy()
            self._map = None

    def _release_engine(self) -> None:
        self._session = self._runner = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _apply_parameters(self, changes: list[Any]) -> None:
        if getattr(self, '_runner', None) is not None:
            LingbotMapNode._apply_parameters(self, changes)
        else:  # not configured: the values are read at configure
            self._values = {**self._values, **{p.name: p.value for p in changes}}

    def destroy_node(self) -> None:
        """Release the engine and the thread, then destroy the node."""
        self._stop_inputs()
        self._destroy_interfaces()
        self._release_engine()
        logging_bridge.detach(self._log_handler)
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the lifecycle node until shutdown; it waits unconfigured for its transitions.

    Returns:
        Process exit code: 0 on a clean shutdown, 1 when the node could not start.
    """
    return node_main(args, LingbotMapLifecycleNode, 'lingbot_map_lifecycle_node')


if __name__ == '__main__':
    sys.exit(main())
