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
"""The node's IMU (``input.imu_topic``): its input, the scale tracker on the session, the status.

Built by :class:`~lingbot_map_ros.ros.inference.frame_pipeline.FramePipeline` when
``input.imu_topic`` is set (with several cameras, on the primary camera's session); None
otherwise, and then nothing in the node changes. It holds

- the :class:`~lingbot_map_ros.ros.inference.imu_input.ImuInput` (the readings checked, every
  drop counted), subscribed by :mod:`~lingbot_map_ros.ros.inference.inputs` beside the depth
  input; each colour image's stamp is noted on arrival (:meth:`ImuFusion.note_image`: the
  reference of the future-stamp check);
- the :class:`~lingbot_map_ros.engine.imu.scale_tracker.ImuScaleTracker`, attached to the
  rollover session's IMU hook (``engine/session/imu_session.py``), which feeds it every
  keyframe and applies its locked scale; it aligns only while the stream is ``ok``;
- the ``<node>: imu`` diagnostics status (:meth:`ImuFusion.status`), with the depth camera's
  scale beside it when ``metric.source`` is ``depth``;
- the :class:`~lingbot_map_ros.engine.imu.leveling.GravityLevel` of ``odom`` / ``map``
  (:meth:`ImuFusion.level_frames`, on the primary camera's odom frames): still readings up to the
  anchor level ``odom``, else the alignment's gravity levels ``map`` (docs/imu.md, Frames).

The mounting is ``imu.imu_from_camera`` (camera optical frame into the IMU frame), replaced by
``/tf_static`` when tf2_ros finds the IMU frame -> camera frame there
(:mod:`~lingbot_map_ros.ros.inference.imu_mounting`).
"""

from __future__ import annotations

from typing import Any

from lingbot_map_ros.engine.imu import AlignmentOptions, ImuScaleTracker
from lingbot_map_ros.engine.imu.keyframe_rotation import ImuRotations
from lingbot_map_ros.engine.imu.leveling import GravityLevel
from lingbot_map_ros.ros.inference import imu_mounting
from lingbot_map_ros.ros.inference.imu_input import ImuInput, subscribe
from lingbot_map_ros.ros.parameters import params
from lingbot_map_ros.ros.parameters.mounting import pose7_to_matrix
from lingbot_map_ros.ros.publishers.imu_status import imu_status


class ImuFusion:
    """The node's IMU input, its tracker on one session, and its status (module docstring)."""

    def __init__(self, node: Any, values: dict[str, Any], session: Any) -> None:
        """Build the input and the tracker, and attach the tracker to ``session``.

        Args:
            node: the rclpy node (its logger and clock).
            values: the node's parameter values (``input.imu_topic``, ``imu.*``).
            session: the ``RolloverSession`` whose keyframes the IMU is aligned with.

        Raises:
            ValueError: a bad ``imu.*`` value.
        """
        self.config = params.imu_config(values)
        log = node.get_logger()
        clock = node.get_clock()
        self.input = ImuInput(self.config, log.warning,
                              now=lambda: clock.now().nanoseconds * 1e-9, info=log.info)
        tf = imu_mounting.static_tf_buffer(node)  # mounting hook (imu_mounting.py)
        self._tf_listener = None if tf is None else tf[1]
        self.mounting = imu_mounting.ImuMounting(
            pose7_to_matrix(self.config.imu_from_camera, 'imu.imu_from_camera'),
            None if tf is None else tf[0])
        self._camera_frame = str(values.get('frames.camera_frame') or '')
        self._log = log
        self.imu_from_camera = self.mounting.matrix  # the tracker's; /tf_static updates it
        self._newest_image_s: float | None = None
        self.tracker = ImuScaleTracker(
            self.input.window, options=AlignmentOptions(max_imu_gap_s=self.config.max_gap_s),
            imu_from_camera=self.imu_from_camera, healthy=self._healthy)
        self._session = session
        session.imu.attach(self.tracker)
        self.level = GravityLevel(self.input.window, session.imu.gravity_world,
                                  self.imu_from_camera)
        self._levelled: list[Any] = []

    def _healthy(self, stamp_s: float) -> bool:
        """Return whether the stream is usable at camera time ``stamp_s`` (fusion runs)."""
        return self.input.state(stamp_s) == 'ok'

    def note_image(self, stamp: Any, frame_id: str = '') -> None:
        """Note a colour image's ``builtin_interfaces/Time`` stamp (and frame) on arrival."""
        self.mounting.update(self.input.frame_id, self._camera_frame or frame_id,
                             self._log.warning, self._log.info)
        stamp_s = float(stamp.sec) + 1e-9 * float(stamp.nanosec)
        if stamp_s > 0.0:
            if self._newest_image_s is None or stamp_s > self._newest_image_s:
                self._newest_image_s = stamp_s
            self.input.note_image(stamp_s)

    def subscribe(self, node: Any) -> list[Any]:
        """Subscribe the IMU topic (sensor-data QoS, its own callback group)."""
        return subscribe(node, self.input)

    def status(self, node_name: str) -> Any:
        """Return the imu diagnostics entry, its stream state taken at the newest image."""
        if self._newest_image_s is not None:
            self.input.state(self._newest_image_s)
        metric = self._session.metric
        depth_scale = metric.stats().scale if metric.enabled else None
        stream = {**self.input.status(), 'mounting': self.mounting.source}
        return imu_status(node_name, stream, self._session.imu.stats(), depth_scale,
                          self.level.state())

    def start_line(self) -> str:
        """Return the start-up log line's IMU part."""
        return (f"IMU on '{self.config.topic}' ({self.mounting.describe()}, time offset "
                f'{self.config.time_offset_s:g} s): metric scale from the colour camera once '
                'locked')

    def level_frames(self, primary: Any, node_outputs: Any) -> None:
        """Level the node's ``odom`` (or ``map``) with gravity (docs/imu.md, Frames).

        Args:
            primary: the primary camera's ``Outputs``: its odom is the node's.
            node_outputs: the ``Outputs`` that broadcast the static ``map -> odom`` (loop
                closure off): it follows the levelling of ``map``.
        """
        primary.frames.set_level(self.level)
        node_outputs.follow_map_level(primary.frames)
        self._levelled.append(primary.frames)

    def rotations(self) -> ImuRotations:
        """Return the gyroscope's rotations between camera stamps (graph factors, covariance).

        Over this input's readings and health, with the tracker's gyroscope bias.
        """
        return ImuRotations(self.input.window, self.config.gyro_noise_density,
                            self.imu_from_camera, self._healthy,
                            lambda: self._session.imu.stats().gyro_bias)

    def detach(self) -> None:
        """Detach the tracker from the session (the pipeline is destroyed)."""
        self._session.imu.attach(None)
        if self._tf_listener is not None:  # its /tf_static subscription
            self._tf_listener.unregister()
            self._tf_listener = None
        for frames in self._levelled:
            frames.set_level(None)
        self._levelled = []


def from_values(node: Any, values: dict[str, Any], session: Any) -> ImuFusion | None:
    """Return the node's IMU fusion, or None when ``input.imu_topic`` is empty."""
    if not values.get('input.imu_topic'):
        return None
    return ImuFusion(node, values, session)
