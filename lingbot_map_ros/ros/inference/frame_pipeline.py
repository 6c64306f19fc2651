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
"""The engine session and everything a frame goes through, as one configured part of the node.

:class:`FramePipeline` is built by ``configure`` (it loads the weights) and destroyed by
``cleanup``: a session per camera (:func:`make_sessions`) and the
:class:`~lingbot_map_ros.ros.inference.camera_group.CameraGroup` of the cameras (one camera is a
group of one) with their counters, outputs
(:class:`~lingbot_map_ros.ros.publishers.outputs.Outputs`,
:class:`~lingbot_map_ros.ros.publishers.map_output.MapOutput`) and
:class:`~lingbot_map_ros.ros.inference.session_runner.SessionRunner` s, and the loop closure of
the group of one. :meth:`FramePipeline.warm_up` is the node's one warm-up.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any, Callable

from lingbot_map_ros.config import EngineConfig, MetricConfig
from lingbot_map_ros.engine.imu.odometry_covariance import OdometryCovariance
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.ros.inference import imu_fusion
from lingbot_map_ros.ros.inference.camera_group import CameraGroup
from lingbot_map_ros.ros.inference.loop_feed import LoopFeed
from lingbot_map_ros.ros.inference.session_runner import SessionRunner
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.parameters import input_params, param_checks, params
from lingbot_map_ros.ros.parameters.node_options import NodeOptions
from lingbot_map_ros.ros.publishers import diagnostics
from lingbot_map_ros.ros.publishers.loop_outputs import LoopOutput
from lingbot_map_ros.ros.publishers.map_output import MapOutput
from lingbot_map_ros.ros.publishers.map_reuse import MapReuse
from lingbot_map_ros.ros.publishers.outputs import Outputs
import numpy as np
import torch

try:  # cv_bridge comes with a ROS install, not with the PyPI wheels.
    from cv_bridge import CvBridge
except ImportError:  # pragma: no cover - depends on the machine
    CvBridge = None


def make_session(values: dict[str, Any], config: EngineConfig) -> RolloverSession:
    """Build the engine session (loads the weights) from the node's parameter values.

    Raises:
        ValueError: no weights and ``allow_random_weights`` false.
        WeightsError: the checkpoint does not match the model.
    """
    weights = values['weights'] or None
    random_ok = values['allow_random_weights']
    if weights is None and not random_ok:
        raise ValueError("parameter 'weights' is empty: set it to the LingBot-Map checkpoint "
                         '(weights:=/path/to/lingbot-map.pt), or set '
                         'allow_random_weights:=true for a demo with meaningless poses')
    # With random weights the session itself logs a loud warning (through the log bridge).
    return RolloverSession(StreamingSession(config, weights, allow_random_weights=random_ok,
                                            seed=values['seed']),
                           MetricConfig.from_flat(values))


def make_sessions(values: dict[str, Any], config: EngineConfig
                  ) -> dict[str, RolloverSession]:
    """Build one session per camera of the group (``input_params.group_names``), one engine.

    The weights are loaded once, by the first session; the others open streams on its engine
    (its model, fast path and page pool).

    Raises:
        ValueError, WeightsError: as :func:`make_session`.
    """
    names = input_params.group_names(values)
    first = make_session(values, config)
    engine = first.session.engine
    sessions = {names[0]: first}
    for name in names[1:]:
        sessions[name] = RolloverSession(StreamingSession(config, engine=engine),
                                         MetricConfig.from_flat(values))
    return sessions


def pipeline_config(values: dict[str, Any]) -> EngineConfig:
    """Return the engine configuration; the pool holds a stream per camera at least."""
    config = params.engine_config(values)
    streams = max(config.cache.streams, len(input_params.group_names(values)))
    if streams == config.cache.streams:
        return config
    return dataclasses.replace(config, cache=dataclasses.replace(config.cache, streams=streams))


def release_memory() -> None:
    """Collect what a released session left (reference cycles) and return cached GPU memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def raw_converter(bridge: Any) -> Callable[[Any], np.ndarray]:
    """Return the ``sensor_msgs/Image`` -> RGB converter: cv_bridge after our checks, or ours."""
    if bridge is None:
        return conversions.image_msg_to_rgb

    def convert(msg: Any) -> np.ndarray:
        # Our checks first: the same encodings are accepted, for the same drop reasons,
        # whether cv_bridge is installed or not.
        conversions.check_image_msg(msg)
        try:
            return bridge.imgmsg_to_cv2(msg, desired_encoding='rgb8')
        except Exception:  # noqa: BLE001 - cv_bridge refuses e.g. 8UC3 -> rgb8; ours does not
            return conversions.image_msg_to_rgb(msg)
    return convert


class FramePipeline:
    """Sessions, camera group (counters, outputs, map, runners), loop closure of a node."""

    def __init__(self, node: Any, values: dict[str, Any]) -> None:
        """Build a session per camera (loads the weights once), the group, loop closure.

        ``session``, ``runner``, ``stats`` and ``outputs`` are the primary camera's (the one
        camera's), ``outputs`` the node's own ``~/pose`` and TF.

        What was created is destroyed again when a later step fails.

        Args:
            node: the rclpy node (plain or lifecycle) the outputs belong to.
            values: the node's parameter values.

        Raises:
            ValueError: a bad parameter value, a page pool that cannot pose every camera or
                does not fit the device (``param_checks.check_pool``), or no weights without
                allow_random_weights.
            WeightsError: the checkpoint does not match the model.
            ImportError: the configured attention backend is not installed.
        """
        self._log = node.get_logger()
        self.config = pipeline_config(values)
        refused = param_checks.check_pool(self.config, len(input_params.group_names(values)))
        if refused is not None:  # before any weight or page is allocated
            raise ValueError(refused)
        surplus = param_checks.pool_surplus(self.config, len(input_params.group_names(values)))
        if surplus is not None:
            self._log.warning(surplus)
        sessions = make_sessions(values, self.config)
        self.session: RolloverSession | None = sessions[input_params.primary_camera(values)]
        self.cameras: CameraGroup | None = None
        self.outputs: Outputs | None = None
        self.map_output: MapOutput | None = None
        self.loop_output: LoopOutput | None = None
        self.map_reuse: MapReuse | None = None
        self.runner: SessionRunner | None = None
        self.stats: diagnostics.NodeStats | None = None
        self.imu: imu_fusion.ImuFusion | None = None  # input.imu_topic (docs/imu.md)
        try:
            options = NodeOptions.from_values(values)
            bridge = CvBridge() if CvBridge is not None else None
            self.has_bridge = bridge is not None
            solo = not input_params.camera_names(values)
            if values['loop.enable'] and not solo:
                self._log.warning('loop.enable is true, but loop closure runs with one camera '
                                  'only: map -> odom stays a static identity')
                # The fused outputs then broadcast the static identity map -> odom.
                values = {**values, 'loop.enable': False}
            self.cameras = CameraGroup(node, values, sessions, options, raw_converter(bridge),
                                       self.config.stream.device)
            self.outputs, self.map_output = self.cameras.fused, self.cameras.map_output
            self.runner = self.cameras.runners[self.cameras.primary]
            self.stats = self.cameras.stats[self.cameras.primary]
            if self.cameras.solo:  # loop closure runs on the group of one
                self.loop_output = LoopOutput(node, values,
                                              LoopFeed(self.session, values, self._log),
                                              self.outputs)
                self.map_reuse = MapReuse(node, values, self.session, self.loop_output,
                                          self.map_output, self.outputs)
                self.runner.add_outputs(self.loop_output)
            self.imu = imu_fusion.from_values(node, values, self.session)
            if self.imu is not None:  # gravity levels odom or map (docs/imu.md, Frames)
                self.imu.level_frames(self.cameras.outputs[self.cameras.primary], self.outputs)
            if self.imu is not None and self.cameras.solo:  # the gyroscope fused (docs/imu.md)
                self.outputs.use_covariance(OdometryCovariance(
                    self.imu.rotations(), self.imu.config.odometry_translation_walk))
                if self.loop_output is not None:
                    self.loop_output.feed.use_imu(self.imu.rotations())
        except BaseException:
            self.destroy()
            raise

    @property
    def runners(self) -> list[SessionRunner]:
        """Return every camera's runner."""
        return [] if self.cameras is None else list(self.cameras.runners.values())

    @property
    def resetter(self) -> CameraGroup | None:
        """Return what ``~/reset`` and a clock jump reset: the camera group."""
        return self.cameras

    def warm_up(self, cancelled: Callable[[], bool]) -> None:
        """Run gray frames of ``stream.image_width`` (4:3) through the model, then reset it.

        The first camera frames are then not the slow ones. With the fast path on, the session
        builds it on the first frame of a size (a scale pass, a keyframe and a non-keyframe,
        graphs captured: ``engine/session/pipeline.py``), so one frame does it; in eager mode the
        scale frames and one streaming frame run here. The rollover wrapper is not involved, so its
        session count starts at the first camera frame.

        Args:
            cancelled: polled between frames; True stops the warm-up early (shutdown).
        """
        session = self.session.session
        scale_frames = self.config.cache.scale_frames
        eager = session.stats().fast_path == 'eager'
        count = min(scale_frames + 1, self.config.model.max_frame_num) if eager else 1
        width = self.config.stream.image_width
        frame = np.full((width * 3 // 4, width, 3), 128, np.uint8)
        start = time.monotonic()
        for i in range(count):
            if cancelled():
                break
            session.step(frame, (i + 1) * 100_000_000)
        session.reset()
        self._log.info(f'warmed up in {time.monotonic() - start:.1f} s')

    def set_options(self, values: dict[str, Any], changed: set[str]) -> None:
        """Hand changed parameter values to the runner and the map (from their next frame)."""
        options = NodeOptions.from_values(values)
        self.cameras.set_options(options, values['diagnostics.stale_after_s'])
        self.map_output.set_options(options)
        live = changed & params.LIVE_ENGINE_PARAMS
        if live:
            config = pipeline_config(values)
            for runner in self.runners:
                runner.set_pending_config(config)
            self._log.info(f'{", ".join(sorted(live))} take effect at the next reset '
                           '(call ~/reset)')

    def log_start(self, values: dict[str, Any]) -> None:
        """Warn about settings that leave outputs silent (the node logs what it listens to)."""
        config, log = self.config, self._log
        if self.imu is not None:
            log.info(self.imu.start_line())
        if values['publish.tf'] and not self.outputs.has_tf:
            log.warning('publish.tf is true but tf2_ros is not importable: no TF is broadcast')
        if values['map.enable'] and not (config.stream.enable_depth and
                                         config.model.enable_depth):
            log.info('map.enable is true but depth is off: ~/map stays empty until '
                     'stream.enable_depth is true (from the next reset)')
        if (values['publish.depth'] or values['publish.cloud']) and \
                not config.stream.enable_depth:
            log.warning('publish.depth/publish.cloud are on but stream.enable_depth is false: '
                        'nothing will be published on ~/depth/image or ~/cloud')
        if values['input.queue_mode'] == 'bag' and (
                values['input.qos.reliability'] != 'reliable' or
                values['input.qos.depth'] < values['input.queue_size']):
            log.warning('bag mode: the middleware still drops frames that arrive faster than '
                        'they are processed unless input.qos.reliability is reliable and '
                        'input.qos.depth >= input.queue_size')

    def destroy(self) -> None:
        """Destroy the outputs and let the session go (the caller frees the memory).

        A frame still running on an abandoned inference thread keeps its own references; the
        session is freed when that thread ends.
        """
        if self.imu is not None:
            self.imu.detach()
            self.imu = None
        if self.cameras is not None:
            self.cameras.destroy()
        if self.map_reuse is not None:
            self.map_reuse.destroy()
            self.map_reuse = None
        if self.loop_output is not None:
            self.loop_output.destroy()
        self.outputs = self.map_output = self.runner = self.session = self.cameras = None
        self.loop_output = None
