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
"""``~/reset`` and ``/diagnostics`` of a configured node.

Both callbacks are guarded (``callback_guard.py``): an unexpected exception is answered or
logged and the node lives. Both have their own callback groups, so they answer while a frame
is being processed. The diagnostics timer runs on the steady clock: with ``use_sim_time`` a
paused bag freezes ROS time, and diagnostics must still report (that is when STALE matters).
The statuses themselves are rendered by :mod:`~lingbot_map_ros.ros.publishers.diagnostics`,
:mod:`~lingbot_map_ros.ros.publishers.stall_watch` and
:mod:`~lingbot_map_ros.ros.publishers.odometry_status`.
"""

from __future__ import annotations

from typing import Any, Callable

from diagnostic_msgs.msg import DiagnosticArray
from lingbot_map_ros.ros.inference.frame_pipeline import FramePipeline
from lingbot_map_ros.ros.publishers import diagnostics, stall_watch
from lingbot_map_ros.ros.publishers.callback_guard import guard_service, guard_timer
from lingbot_map_ros.ros.publishers.odometry_status import odometry_status
from lingbot_map_ros.ros.publishers.service_qos import service_qos
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from std_srvs.srv import Trigger

RESET_WAIT_S = 10.0
"""Longest wait of the reset service for the frame in progress."""


class NodeServices:
    """The reset service, the diagnostics publisher and its timer."""

    def __init__(self, node: Any, values: dict[str, Any], pipeline: FramePipeline,
                 topic: str, queue_length: Callable[[], int]) -> None:
        """Create ``~/reset``, ``/diagnostics`` and the timer.

        Args:
            node: the rclpy node.
            values: the node's parameter values (``diagnostics.*``, ``input.*``).
            pipeline: the configured pipeline (counters, runner, session config, frames).
            topic: the resolved input topic, shown in the input status.
            queue_length: frames waiting for the worker now (0 while inactive).
        """
        self._node = node
        self._values = values
        self._pipeline = pipeline
        self._topic = topic
        self._queue_length = queue_length
        self.reset_wait_s = RESET_WAIT_S
        log = node.get_logger()
        self._reset_srv = node.create_service(Trigger, '~/reset',
                                              guard_service(log, '~/reset', self._on_reset),
                                              qos_profile=service_qos(),
                                              callback_group=MutuallyExclusiveCallbackGroup())
        self._pub = node.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self._group = MutuallyExclusiveCallbackGroup()
        self._timer = self._create_timer()

    def set_values(self, values: dict[str, Any], changed: set[str]) -> None:
        """Use new parameter values; a new ``diagnostics.period_s`` restarts the timer."""
        self._values = values
        if 'diagnostics.period_s' in changed:
            self._node.destroy_timer(self._timer)
            self._timer = self._create_timer()

    def destroy(self) -> None:
        """Remove the timer, the publisher and the service (lifecycle cleanup)."""
        self._node.destroy_timer(self._timer)
        self._node.destroy_publisher(self._pub)
        self._node.destroy_service(self._reset_srv)

    def _create_timer(self) -> Any:
        return self._node.create_timer(self._values['diagnostics.period_s'],
                                       guard_timer(self._node.get_logger(), 'diagnostics',
                                                   self._publish),
                                       callback_group=self._group,
                                       clock=Clock(clock_type=ClockType.STEADY_TIME))

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response
                  ) -> Trigger.Response:
        cameras = self._pipeline.resetter  # every camera's runner
        if cameras is None:  # cleaned up while the request waited
            response.success, response.message = False, 'reset failed: the node is not configured'
            return response
        try:
            # One wait per busy frame: callers queued behind it join the reset already pending.
            wait_s = 0.0 if cameras.reset_pending else self.reset_wait_s
            cleared = cameras.reset('manual', wait_s)
        except Exception as exc:  # noqa: BLE001 - answer the caller instead of raising
            response.success, response.message = False, f'reset failed: {exc}'
            return response
        response.success = True
        if cleared is None:
            response.message = (f'inference busy for more than {wait_s:.0f} s; the '
                                'reset runs before the next frame')
        else:
            response.message = 'cleared ' + ', '.join(f'{k}={v}' for k, v in cleared.items())
        return response

    def _publish(self) -> None:
        if self._pipeline.cameras is None:  # cleaned up under this timer callback
            return
        self._pub.publish(self.diagnostics())

    def diagnostics(self) -> DiagnosticArray:
        """Return this period's statuses: input, engine (with the stall mark), cache, odometry.

        Then loop closure's (one camera) or each named camera's and the ``cameras`` status.
        """
        pipeline, values = self._pipeline, self._values
        report = pipeline.stats.roll()
        runner = pipeline.runner
        session = runner.session_stats()
        config = pipeline.config
        info = {'topic': self._topic, 'transport': values['input.transport'],
                'queue_mode': values['input.queue_mode'], 'queue_length': self._queue_length()}
        # Namespaced, so two cameras' nodes do not share status names.
        name = self._node.get_fully_qualified_name().lstrip('/')
        msg = DiagnosticArray()
        msg.header.stamp = self._node.get_clock().now().to_msg()
        msg.status = [
            diagnostics.input_status(name, report, info, values['diagnostics.stale_after_s']),
            stall_watch.mark_stall(
                diagnostics.engine_status(name, report, session, config.cache.scale_frames),
                runner.busy_s(), values['diagnostics.stall_after_s']),
            diagnostics.cache_status(name, session.cache, session.time_index,
                                     config.model.max_frame_num,
                                     config.stream.session_keyframes),
            odometry_status(name, runner.rollover_stats(), pipeline.outputs.frames_info(),
                            config.stream.session_keyframes, pipeline.session.metric.stats(),
                            getattr(runner.depth_input, 'drops_total', 0))]
        if pipeline.loop_output is not None:
            msg.status.append(pipeline.loop_output.status(name))
        if getattr(pipeline, 'imu', None) is not None:  # input.imu_topic (docs/imu.md)
            msg.status.append(pipeline.imu.status(name))
        msg.status += pipeline.cameras.statuses(name, values, report,
                                                pipeline.session.session.engine.pool_stats(),
                                                config.cache.scale_frames)
        return msg
