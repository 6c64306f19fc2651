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
  scale beside it when ``metric.source`` is ``depth``.

The mounting is ``imu.imu_from_camera`` (camera optical frame into the IMU frame); the node does
not read it from TF.
"""

from __future__ import annotations

from typing import Any

from lingbot_map_ros.engine.imu import AlignmentOptions, ImuScaleTracker
from lingbot_map_ros.engine.imu.keyframe_rotation import ImuRotations
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
                              now=lambda: clock.now().nanoseconds * 1e-9)
        self.imu_from_camera = pose7_to_matrix(self.config.imu_from_camera,
                                               'imu.imu_from_camera')
        self._newest_image_s: float | None = None
        self.tracker = ImuScaleTracker(
            self.input.window, options=AlignmentOptions(max_imu_gap_s=self.config.max_gap_s),
            imu_from_camera=self.imu_from_camera, healthy=self._healthy)
        self._session = session
        session.imu.attach(self.tracker)

    def _healthy(self, stamp_s: float) -> bool:
        """Return whether the stream is usable at camera time ``stamp_s`` (fusion runs)."""
        return self.input.state(stamp_s) == 'ok'

    def note_image(self, stamp: Any) -> None:
        """Note a colour image's ``builtin_interfaces/Time`` stamp on arrival."""
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
        return imu_status(node_name, self.input.status(), self._session.imu.stats(), depth_scale)

    def start_line(self) -> str:
        """Return the start-up log line's IMU part."""
        mount = ' '.join(f'{v:g}' for v in self.config.imu_from_camera)
        return (f"IMU on '{self.config.topic}' (imu_from_camera [{mount}], time offset "
                f'{self.config.time_offset_s:g} s): metric scale from the colour camera once '
                'locked')

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


def from_values(node: Any, values: dict[str, Any], session: Any) -> ImuFusion | None:
    """Return the node's IMU fusion, or None when ``input.imu_topic`` is empty."""
    if not values.get('input.imu_topic'):
        return None
    return ImuFusion(node, values, session)
