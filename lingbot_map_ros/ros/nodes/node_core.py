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
"""The node as one object composed of parts, with explicit lifecycle steps (nav2 style).

Both executables run this object: ``lingbot_map_node`` (:mod:`~lingbot_map_ros.ros.nodes.node`)
calls :meth:`~LingbotMapCore.configure` and :meth:`~LingbotMapCore.activate` at start, and
``lingbot_map_lifecycle_node`` (:mod:`~lingbot_map_ros.ros.nodes.lifecycle_node`) maps each
transition onto the step of the same name. The parts:

==================  ======================================================  ==================
part                what it holds                                           exists
==================  ======================================================  ==================
``values``          the parameters (declared at construction), callbacks    always
``pipeline``        session, counters, outputs, map, runner; one warm-up    configured
                    (:class:`~lingbot_map_ros.ros.inference.frame_pipeline.FramePipeline`)
``services``        ``~/reset``, ``/diagnostics`` and its timer             configured
                    (:class:`~lingbot_map_ros.ros.nodes.node_services.NodeServices`)
``inputs``          subscriptions, frame queue, inference thread            active
                    (:class:`~lingbot_map_ros.ros.inference.inputs.Inputs`)
==================  ======================================================  ==================

A frame in progress when the node stops: ``deactivate`` waits up to ``DEACTIVATE_WAIT_S`` and
then lets it finish in the background (its outputs are still published: the node stopped taking
frames, not finishing them). ``cleanup`` and ``shutdown`` wait for such a frame up to their own
bound, then abandon it: its thread ends by itself when the engine returns, publishes nothing
more (errors of its dead publishers are expected and not reported) and frees the session as it
ends. Steps are serialised by one lock, so the process's shutdown (main thread) and a transition
(executor thread) never interleave.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from lingbot_map_ros.ros.inference.frame_pipeline import FramePipeline, release_memory
from lingbot_map_ros.ros.inference.inputs import Inputs
from lingbot_map_ros.ros.inference.worker import Worker
from lingbot_map_ros.ros.nodes import input_watch, logging_bridge
from lingbot_map_ros.ros.nodes.node_services import NodeServices
from lingbot_map_ros.ros.parameters import node_params
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import JumpThreshold
from rclpy.duration import Duration

__all__ = ['DEACTIVATE_WAIT_S', 'LingbotMapCore', 'STOP_WAIT_S']

DEACTIVATE_WAIT_S = 3.0
"""Longest wait of ``deactivate`` for the frame in progress (it then ends in the background)."""
STOP_WAIT_S = 3.0
"""Longest wait of ``cleanup`` and ``shutdown`` for a frame still running (then abandoned)."""


class LingbotMapCore:
    """Parameters, pipeline, services and inputs of one node, and the steps between them."""

    def __init__(self, node: Any) -> None:
        """Declare the parameters and register their callbacks; nothing is loaded yet.

        Args:
            node: the ``rclpy`` node (plain or lifecycle) the parts belong to.

        Raises:
            ValueError: a bad parameter value.
            rclpy.exceptions.ParameterException: a value outside its declared range.
        """
        self._node = node
        self._log = node.get_logger()
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._log_handler = logging_bridge.attach(self._log)
        try:
            self.values = node_params.declare_all(node)
        except BaseException:
            logging_bridge.detach(self._log_handler)
            raise
        self.pipeline: FramePipeline | None = None
        self.services: NodeServices | None = None
        self.inputs: Inputs | None = None
        self._watch: input_watch.InputWatch | None = None
        self._draining: list[Worker] = []
        self._shut_down = False
        node.add_on_set_parameters_callback(self._validate_parameters)
        node.add_post_set_parameters_callback(self._apply_parameters)
        # Sim time going backwards (bag loop) invalidates the map like an image stamp jump.
        self._jump_handle = node.get_clock().create_jump_callback(
            JumpThreshold(min_forward=None, min_backward=Duration(nanoseconds=-1)),
            post_callback=self._on_clock_jump)

    # ---- lifecycle steps ------------------------------------------------------------------------

    def configure(self) -> None:
        """Load the weights, warm up once, create the outputs, ``~/reset`` and diagnostics.

        What was created before an error is removed again.

        Raises:
            ValueError: a bad parameter value, or no weights without allow_random_weights.
            WeightsError: the checkpoint does not match the model.
            ImportError: the configured attention backend is not installed.
            RuntimeError: the node is shutting down.
        """
        with self._lock:
            if self.pipeline is not None:
                return
            if self._stopping.is_set():
                raise RuntimeError('configure: the node is shutting down')
            pipeline = None
            try:
                pipeline = FramePipeline(self._node, self.values)
                pipeline.warm_up(self._stopping.is_set)
                self.services = NodeServices(self._node, self.values, pipeline,
                                             ', '.join(pipeline.cameras.topics.values()),
                                             self._queue_length)
            except BaseException:
                if pipeline is not None:
                    pipeline.destroy()
                release_memory()  # a session built before the failure holds the weights
                raise
            self.pipeline = pipeline

    def activate(self) -> None:
        """Start the inference thread and subscribe to the inputs.

        Raises:
            RuntimeError: the node is not configured.
        """
        with self._lock:
            if self.inputs is not None:
                return
            if self.pipeline is None:
                raise RuntimeError('activate: the node is not configured')
            self.inputs = Inputs(self._node, self.values, self.pipeline)
            self._log.info(input_watch.startup_line(self._node, self.values, self.pipeline))
            self.pipeline.log_start(self.values)
            self._watch = input_watch.InputWatch(
                self._node, input_watch.watched_inputs(self._node, self.values, self.pipeline),
                self.values['diagnostics.no_input_warn_s'])

    def deactivate(self, wait_s: float = DEACTIVATE_WAIT_S) -> bool:
        """Unsubscribe and stop the inference thread; the session (the map) is kept.

        Args:
            wait_s: longest wait for the frame in progress.

        Returns:
            True when no frame is running any more; False when one finishes in the background.
        """
        with self._lock:
            if self._stop_inputs(wait_s):
                return True
            self._log.info(f'the frame in progress did not finish within {wait_s:.0f} s; it '
                           'finishes in the background')
            return False

    def cleanup(self, wait_s: float = STOP_WAIT_S) -> bool:
        """Deactivate if active, destroy the services, outputs and session, free the memory.

        Args:
            wait_s: longest wait, in all, for a frame still running; then it is abandoned.

        Returns:
            True when no frame was abandoned.
        """
        deadline = time.monotonic() + wait_s
        with self._lock:
            self._stop_inputs(wait_s)
            running = [w for w in self._draining
                       if not w.stop(deadline - time.monotonic())]
            self._draining = []
            for worker in running:
                worker.abandon(self._on_abandoned_frame_end)
            if running:
                self._log.warning(
                    f'the frame in progress did not finish within {wait_s:.0f} s; abandoned: '
                    'its outputs are discarded and the session is freed when it ends')
            if self.services is not None:
                self.services.destroy()
                self.services = None
            if self.pipeline is not None:
                self.pipeline.destroy()
                self.pipeline = None
            release_memory()
            return not running

    def shutdown(self, wait_s: float = STOP_WAIT_S) -> bool:
        """Release everything whatever the state (node destruction, process shutdown).

        A warm-up in progress stops at its next frame. Idempotent.

        Args:
            wait_s: longest wait, in all, for a running transition and a running frame.

        Returns:
            True when nothing of the node is still running (no abandoned frame, no transition).
        """
        deadline = time.monotonic() + wait_s
        self._stopping.set()
        if not self._lock.acquire(timeout=max(wait_s, 0.0)):
            self._log.warning(f'a lifecycle transition still runs after {wait_s:.0f} s; '
                              'not waiting for it')
            return False
        try:
            if self._shut_down:
                return True
            finished = self.cleanup(max(deadline - time.monotonic(), 0.0))
            self._jump_handle.unregister()
            logging_bridge.detach(self._log_handler)
            self._shut_down = True
            return finished
        finally:
            self._lock.release()

    # ---- callbacks ------------------------------------------------------------------------------

    def _stop_inputs(self, wait_s: float) -> bool:
        """Stop the inputs; a worker still in a frame after ``wait_s`` joins the draining ones."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.destroy()
        inputs, self.inputs = self.inputs, None
        if inputs is None or inputs.stop(wait_s):
            return True
        self._draining.append(inputs.worker)
        return False

    def _queue_length(self) -> int:
        inputs = self.inputs
        return len(inputs.queue) if inputs is not None else 0

    def _on_abandoned_frame_end(self) -> None:
        """Run on an abandoned worker's thread as it ends: free what its frame held."""
        release_memory()
        if not self._shut_down and self._node.context.ok():
            self._log.info('the abandoned frame ended; its outputs were discarded and its '
                           'memory freed')

    def _on_clock_jump(self, _jump: Any) -> None:
        pipeline = self.pipeline
        runner = pipeline.resetter if pipeline is not None else None
        if runner is not None:
            runner.request_reset('clock_jump')

    def _validate_parameters(self, changes: list[Any]) -> SetParametersResult:
        reason = node_params.check_changes({p.name: p.value for p in changes}, self.values)
        return SetParametersResult(successful=reason is None, reason=reason or '')

    def _apply_parameters(self, changes: list[Any]) -> None:
        with self._lock:
            self.values = {**self.values, **{p.name: p.value for p in changes}}
            names = {p.name for p in changes}
            if self.pipeline is not None:  # unconfigured: the values are read at configure
                self.pipeline.set_options(self.values, names)
            if self.services is not None:
                self.services.set_values(self.values, names)
