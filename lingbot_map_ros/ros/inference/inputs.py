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
"""The active part of the node: the input subscriptions, the frame queue and the inference thread.

Created by ``activate``, stopped by ``deactivate``. The subscription callbacks only queue the
message (:mod:`~lingbot_map_ros.ros.inference.worker`); the worker thread hands it to the
:class:`~lingbot_map_ros.ros.inference.camera_group.CameraGroup`. Each camera of the group has its
``<name>/image`` and ``<name>/camera_info`` subscriptions (the one unnamed camera's: ``image``,
``camera_info`` and, with ``metric.source: depth``, ``depth``).
"""

from __future__ import annotations

import time
from typing import Any

from lingbot_map_ros.ros.inference import depth_input
from lingbot_map_ros.ros.inference.camera_group import CameraQueue
from lingbot_map_ros.ros.inference.frame_pipeline import FramePipeline
from lingbot_map_ros.ros.inference.session_runner import InputFrame, SessionRunner
from lingbot_map_ros.ros.inference.worker import Worker
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.parameters import input_params
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo, CompressedImage, Image


class Inputs:
    """Subscriptions, queue and worker thread of an active node."""

    def __init__(self, node: Any, values: dict[str, Any], pipeline: FramePipeline) -> None:
        """Start the worker thread, then subscribe to each camera's inputs.

        Args:
            node: the rclpy node.
            values: the node's parameter values (``input.*``).
            pipeline: the configured pipeline whose camera group processes the frames.
        """
        self._node = node
        self._stats = pipeline.stats
        self._imu = pipeline.imu
        cameras = pipeline.cameras
        self.queue = CameraQueue(
            len(cameras.names), values['input.queue_size'], values['input.queue_mode'] == 'bag',
            count_overflow=lambda name, num: cameras.stats[name].count_drop(
                'queue_overflow', num=num))
        queue = self.queue

        def handler(item: InputFrame) -> None:
            cameras.handle(item, queue)
        self.worker = Worker(self.queue, handler, self._on_worker_error)
        self.worker.start()
        reliability = ReliabilityPolicy.RELIABLE if values['input.qos.reliability'] == \
            'reliable' else ReliabilityPolicy.BEST_EFFORT
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=values['input.qos.depth'],
                         reliability=reliability)
        group = MutuallyExclusiveCallbackGroup()
        self._compressed = values['input.transport'] == 'compressed'
        self._subs = [sub for name in cameras.names
                      for sub in self._subscribe_camera(name, cameras, qos, group)]
        if pipeline.imu is not None:  # input.imu_topic (ros/inference/imu_fusion.py)
            self._subs += pipeline.imu.subscribe(node)

    def _subscribe_camera(self, name: str, cameras: Any, qos: QoSProfile, group: Any
                          ) -> list[Any]:
        """Subscribe camera ``name``'s image (or its ``/compressed``), camera_info and depth."""
        stats, runner = cameras.stats[name], cameras.runners[name]
        depth = runner.depth_input
        imu = self._imu
        imu_camera = name == cameras.primary  # the IMU's mounting is on the primary camera

        def on_image(msg: Any) -> None:
            stats.count_received()
            if depth is not None:  # the newest colour stamp, for depth pairing
                depth.note_colour(msg.header.stamp)
            if imu is not None:  # the newest colour stamp, for the IMU's future-stamp check
                imu.note_image(msg.header.stamp, msg.header.frame_id if imu_camera else '')
            dropped = self.queue.put(InputFrame(msg, self._compressed, time.monotonic(), name))
            if dropped:
                stats.count_drop('queue_overflow', num=dropped)

        def on_info(msg: Any) -> None:
            self._take_camera_info(runner, msg)
        return [self._node.create_subscription(
                    CompressedImage if self._compressed else Image, cameras.topics[name],
                    on_image, qos, callback_group=group),
                self._node.create_subscription(
                    CameraInfo, input_params.camera_topic(name, 'camera_info'), on_info, qos,
                    callback_group=group),
                *depth_input.subscribe(self._node, depth, qos)]

    def stop(self, timeout_s: float) -> bool:
        """Unsubscribe, stop taking frames and wait at most ``timeout_s`` for the current one.

        Returns:
            True when the worker thread ended; otherwise it is still finishing its frame.
        """
        for sub in self._subs:
            self._node.destroy_subscription(sub)
        self._subs = []
        return self.worker.stop(timeout_s)

    def _take_camera_info(self, runner: SessionRunner, msg: Any) -> None:
        try:
            runner.set_camera_k(conversions.camera_info_k(msg))
        except ValueError as exc:
            self._node.get_logger().warning(f'ignoring camera_info: {exc}',
                                            throttle_duration_sec=60.0)

    def _on_worker_error(self, exc: BaseException) -> None:
        if not self._node.context.ok():
            return  # the context ended under the frame (an embedding process shut it down)
        self._stats.count_error(f'{type(exc).__name__}: {exc}')
        self._node.get_logger().error(
            f'unexpected error in the worker: {type(exc).__name__}: {exc}',
            throttle_duration_sec=5.0)
