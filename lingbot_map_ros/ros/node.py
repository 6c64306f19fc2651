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

Subscribes (relative names, so namespaces and remaps work):
    ``image`` (sensor_msgs/Image) or ``<image>/compressed`` (sensor_msgs/CompressedImage) with
    ``input.transport: compressed``; ``camera_info`` (optional, only compared with the estimate);
    ``depth`` (sensor_msgs/Image aligned to the image, with ``metric.source: depth``:
    :mod:`~lingbot_map_ros.ros.depth_input`).
Publishes (private names), stamped with the input image's stamp:
    ``~/pose``, ``~/odometry``, ``~/path``, ``~/depth/image`` + ``~/depth/camera_info``,
    ``~/cloud``, ``~/map`` (:mod:`~lingbot_map_ros.ros.map_output`),
    TF ``odom_frame -> base_frame`` (REP 105, docs/odometry.md), ``/diagnostics``.
Services: ``~/reset``, ``~/save`` (std_srvs/Trigger).

Threads: the executor only queues messages; a worker thread runs inference
(:mod:`~lingbot_map_ros.ros.worker`). The reset service and the diagnostics timer have their own
callback groups, so they answer while a frame is being processed. Parameters:
:mod:`~lingbot_map_ros.ros.params`. Frames and scale: :mod:`~lingbot_map_ros.ros.outputs`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from lingbot_map_ros.config import MetricConfig
from lingbot_map_ros.engine.errors import WeightsError
from lingbot_map_ros.engine.pipeline import StreamingSession
from lingbot_map_ros.engine.rollover import RolloverSession
from lingbot_map_ros.ros import cli_help, conversions, diagnostics, logging_bridge, params
from lingbot_map_ros.ros import depth_input, stall_watch
from lingbot_map_ros.ros.map_output import MapOutput
from lingbot_map_ros.ros.node_options import NodeOptions
from lingbot_map_ros.ros.odometry_status import odometry_status
from lingbot_map_ros.ros.outputs import Outputs
from lingbot_map_ros.ros.session_runner import InputFrame, SessionRunner
from lingbot_map_ros.ros.worker import FrameQueue, Worker
from rcl_interfaces.msg import SetParametersResult
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType, JumpThreshold
from rclpy.duration import Duration
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import qos_profile_services_default
from sensor_msgs.msg import CameraInfo, CompressedImage, Image
from std_srvs.srv import Trigger

try:  # cv_bridge comes with a ROS install, not with the PyPI wheels.
    from cv_bridge import CvBridge
except ImportError:  # pragma: no cover - depends on the machine
    CvBridge = None

NODE_NAME = 'lingbot_map'
# Longest wait of the reset service for the frame in progress.
_RESET_WAIT_S = 10.0
# Longest wait at shutdown for the frame in progress; ros2 launch escalates to SIGTERM after 5 s.
_SHUTDOWN_WAIT_S = 3.0
# Reset requests held by the service: every caller of a burst is answered (the default of 10
# silently dropped the rest).
_RESET_QUEUE_DEPTH = 1000


def _reset_qos() -> QoSProfile:
    """Return the services' default QoS with a queue deep enough for a burst of callers."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=_RESET_QUEUE_DEPTH,
                      reliability=qos_profile_services_default.reliability,
                      durability=qos_profile_services_default.durability)


class LingbotMapNode(Node):
    """Streams camera images through the engine and publishes poses, path, depth and cloud."""

    def __init__(self, **kwargs: Any) -> None:
        """Declare parameters, build the engine session, then the ROS interfaces.

        Args:
            **kwargs: passed to ``rclpy.node.Node`` (e.g. ``parameter_overrides``, ``context``).

        Raises:
            ValueError: a bad parameter value, or no weights without allow_random_weights.
            WeightsError: the checkpoint does not match the model.
            ImportError: the configured attention backend is not installed.
        """
        super().__init__(NODE_NAME, **kwargs)
        self._log_handler = logging_bridge.attach(self.get_logger())
        try:
            self._build()
        except BaseException:
            logging_bridge.detach(self._log_handler)
            raise

    def _build(self) -> None:
        self._values = params.declare_all(self)
        config, has_bridge = self._build_engine()
        self._queue, self._worker = self._make_worker()
        self._create_interfaces()
        self.add_on_set_parameters_callback(self._validate_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)
        # Sim time going backwards (bag loop) invalidates the map like an image stamp jump.
        self._jump_handle = self.get_clock().create_jump_callback(
            JumpThreshold(min_forward=None, min_backward=Duration(nanoseconds=-1)),
            post_callback=lambda _jump: self._runner.request_reset('clock_jump'))
        self._worker.start()
        self._log_startup(config, has_bridge)

    def _build_engine(self) -> tuple[Any, bool]:
        """Build the session (loads the weights), outputs and runner from the parameters.

        Returns:
            The engine config and whether cv_bridge converts raw images.
        """
        config = params.engine_config(self._values)
        self._session = self._make_session(config)
        self._stats = diagnostics.NodeStats()
        self._outputs = Outputs(self, self._values)
        options = NodeOptions.from_values(self._values)
        self._map = MapOutput(self, options, config.stream.device, self._outputs.frames,
                              self._outputs.frames_info())
        bridge = CvBridge() if CvBridge is not None else None
        depth = depth_input.from_values(self._values, self._stats, self.get_logger())  # metric
        self._runner = SessionRunner(self._session, self._outputs, self._stats,
                                     self.get_logger(), options, self._raw_converter(bridge),
                                     extra_outputs=(self._map,), depth_input=depth)
        return config, bridge is not None

    def _make_worker(self) -> tuple[FrameQueue, Worker]:
        """Return a new frame queue and a (not started) worker thread feeding the runner."""
        bag = self._values['input.queue_mode'] == 'bag'
        queue = FrameQueue(self._values['input.queue_size'] if bag else 1, bag)
        return queue, Worker(queue, self._runner.handle, self._on_worker_error)

    def _make_session(self, config: Any) -> RolloverSession:
        weights = self._values['weights'] or None
        random_ok = self._values['allow_random_weights']
        if weights is None and not random_ok:
            raise ValueError("parameter 'weights' is empty: set it to the LingBot-Map checkpoint "
                             '(weights:=/path/to/lingbot-map.pt), or set '
                             'allow_random_weights:=true for a demo with meaningless poses')
        # With random weights the session itself logs a loud warning (through the bridge).
        return RolloverSession(StreamingSession(config, weights, allow_random_weights=random_ok,
                                                seed=self._values['seed']),
                               MetricConfig.from_flat(self._values))

    @staticmethod
    def _raw_converter(bridge: Any) -> Any:
        if bridge is None:
            return conversions.image_msg_to_rgb

        def convert(msg: Any) -> Any:
            # Our checks first: the same encodings are accepted, for the same drop reasons,
            # whether cv_bridge is installed or not.
            conversions.check_image_msg(msg)
            try:
                return bridge.imgmsg_to_cv2(msg, desired_encoding='rgb8')
            except Exception:  # noqa: BLE001 - cv_bridge refuses e.g. 8UC3 -> rgb8; ours does not
                return conversions.image_msg_to_rgb(msg)
        return convert

    def _create_interfaces(self) -> None:
        self._create_inputs()
        self._create_services()

    def _create_services(self) -> None:
        """Create ``~/reset``, the ``/diagnostics`` publisher and its timer."""
        self._reset_srv = self.create_service(Trigger, '~/reset', self._on_reset,
                                              qos_profile=_reset_qos(),
                                              callback_group=MutuallyExclusiveCallbackGroup())
        self._diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self._diag_group = MutuallyExclusiveCallbackGroup()
        self._diag_timer = self._create_diagnostics_timer()

    def _create_inputs(self) -> list[Any]:
        """Subscribe to the image and camera_info topics; returns the subscriptions."""
        v = self._values
        reliability = ReliabilityPolicy.RELIABLE if v['input.qos.reliability'] == 'reliable' \
            else ReliabilityPolicy.BEST_EFFORT
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=v['input.qos.depth'],
                         reliability=reliability)
        input_group = MutuallyExclusiveCallbackGroup()
        self._compressed = v['input.transport'] == 'compressed'
        # Like image_transport: the compressed topic hangs under the resolved raw topic.
        self._topic = self.resolve_topic_name('image')
        if self._compressed:
            self._topic += '/compressed'
        return [self.create_subscription(CompressedImage if self._compressed else Image,
                                         self._topic, self._on_image, qos,
                                         callback_group=input_group),
                self.create_subscription(CameraInfo, 'camera_info', self._on_camera_info, qos,
                                         callback_group=input_group),
                *depth_input.subscribe(self, self._runner.depth_input, qos)]  # metric

    def _create_diagnostics_timer(self) -> Any:
        # Steady clock: with use_sim_time a paused bag freezes ROS time, and diagnostics must
        # still report (that is when STALE matters).
        return self.create_timer(self._values['diagnostics.period_s'], self._publish_diagnostics,
                                 callback_group=self._diag_group,
                                 clock=Clock(clock_type=ClockType.STEADY_TIME))

    def _log_startup(self, config: Any, has_bridge: bool) -> None:
        v, log = self._values, self.get_logger()
        log.info(f"listening on '{self._topic}' ({v['input.transport']}, "
                 f"{v['input.queue_mode']} mode, converter "
                 f"{'cv_bridge' if has_bridge else 'built-in'}); model "
                 f'{config.model.preset} on {config.stream.device}, backend '
                 f'{config.cache.backend}, weights {self._session.weights}')
        if v['publish.tf'] and not self._outputs.has_tf:
            log.warning('publish.tf is true but tf2_ros is not importable: no TF is broadcast')
        if v['map.enable'] and not (config.stream.enable_depth and config.model.enable_depth):
            log.info('map.enable is true but depth is off: ~/map stays empty until '
                     'stream.enable_depth is true (from the next reset)')
        if (v['publish.depth'] or v['publish.cloud']) and not config.stream.enable_depth:
            log.warning('publish.depth/publish.cloud are on but stream.enable_depth is false: '
                        'nothing will be published on ~/depth/image or ~/cloud')
        if v['input.queue_mode'] == 'bag' and (v['input.qos.reliability'] != 'reliable' or
                                               v['input.qos.depth'] < v['input.queue_size']):
            log.warning('bag mode: the middleware still drops frames that arrive faster than '
                        'they are processed unless input.qos.reliability is reliable and '
                        'input.qos.depth >= input.queue_size')

    def _on_image(self, msg: Any) -> None:
        self._stats.count_received()
        if self._runner.depth_input is not None:  # metric: the newest colour stamp received
            self._runner.depth_input.note_colour(msg.header.stamp)
        dropped = self._queue.put(InputFrame(msg, self._compressed, time.monotonic()))
        if dropped:
            self._stats.count_drop('queue_overflow', num=dropped)

    def _on_camera_info(self, msg: Any) -> None:
        try:
            self._runner.set_camera_k(conversions.camera_info_k(msg))
        except ValueError as exc:
            self.get_logger().warning(f'ignoring camera_info: {exc}',
                                      throttle_duration_sec=60.0)

    def _on_worker_error(self, exc: BaseException) -> None:
        if not self.context.ok():
            return  # shutting down: the frame in flight may fail to publish, that is expected
        self._stats.count_error(f'{type(exc).__name__}: {exc}')
        self.get_logger().error(f'unexpected error in the worker: {type(exc).__name__}: {exc}',
                                throttle_duration_sec=5.0)

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response
                  ) -> Trigger.Response:
        try:
            # One wait per busy frame: callers queued behind it join the reset already pending.
            wait_s = 0.0 if self._runner.reset_pending else _RESET_WAIT_S
            cleared = self._runner.reset('manual', wait_s)
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

    def _publish_diagnostics(self) -> None:
        try:
            self._diag_pub.publish(self._diagnostics())
        except Exception as exc:  # noqa: BLE001 - diagnostics must not stop the node
            self.get_logger().error(f'diagnostics failed: {exc}', throttle_duration_sec=10.0)

    def _diagnostics(self) -> DiagnosticArray:
        report = self._stats.roll()
        session = self._runner.session_stats()
        config = self._session.config
        info = {'topic': self._topic, 'transport': self._values['input.transport'],
                'queue_mode': self._values['input.queue_mode'], 'queue_length': len(self._queue)}
        # Namespaced, so two cameras' nodes do not share status names.
        name = self.get_fully_qualified_name().lstrip('/')
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [
            diagnostics.input_status(name, report, info,
                                     self._values['diagnostics.stale_after_s']),
            stall_watch.mark_stall(
                diagnostics.engine_status(name, report, session, config.cache.scale_frames),
                self._runner.busy_s(), self._values['diagnostics.stall_after_s']),
            diagnostics.cache_status(name, session.cache, session.time_index,
                                     config.model.max_frame_num),
            odometry_status(name, self._runner.rollover_stats(), self._outputs.frames_info(),
                            config.stream.session_keyframes, self._session.metric.stats(),
                            getattr(self._runner.depth_input, 'drops_total', 0))]
        return msg

    def _validate_parameters(self, changes: list[Any]) -> SetParametersResult:
        reason = params.check_changes({p.name: p.value for p in changes}, self._values)
        return SetParametersResult(successful=reason is None, reason=reason or '')

    def _apply_parameters(self, changes: list[Any]) -> None:
        self._values = {**self._values, **{p.name: p.value for p in changes}}
        options = NodeOptions.from_values(self._values)
        self._runner.set_options(options)
        self._map.set_options(options)
        names = {p.name for p in changes}
        if names & params.LIVE_ENGINE_PARAMS:
            self._runner.set_pending_config(params.engine_config(self._values))
            self.get_logger().info(f'{", ".join(sorted(names & params.LIVE_ENGINE_PARAMS))} '
                                   'take effect at the next reset (call ~/reset)')
        if 'diagnostics.period_s' in names:
            self.destroy_timer(self._diag_timer)
            self._diag_timer = self._create_diagnostics_timer()

    def destroy_node(self) -> None:
        """Stop the worker (waiting a few seconds for the frame in progress), destroy the node.

        The engine's log bridge goes first and the warning comes after the node is gone: at
        shutdown the context is already invalid and a record sent to /rosout then fails.
        """
        logging_bridge.detach(self._log_handler)
        stopped = self._worker.stop(_SHUTDOWN_WAIT_S)
        name = self.get_logger().name
        super().destroy_node()
        if not stopped:
            # The worker is a daemon thread: the process exits without waiting for its frame.
            rclpy.logging.get_logger(name).warning(
                f'worker did not finish its frame within {_SHUTDOWN_WAIT_S:.0f} s; abandoned')


def main(args: list[str] | None = None, node_class: type | None = None,
         exe: str = 'lingbot_map_node') -> int:
    """Run the node until shutdown.

    Args:
        args: command line (``sys.argv`` when None).
        node_class: the node to run (the lifecycle executable passes its own); default
            :class:`LingbotMapNode`.
        exe: executable name for ``--help``.

    Returns:
        Process exit code: 0 on a clean shutdown, 1 when the node could not start.
    """
    node_class = node_class or LingbotMapNode
    if cli_help.wants_help(sys.argv[1:] if args is None else args[1:]):
        print(cli_help.help_text(exe, sys.modules[node_class.__module__].__doc__))
        return 0
    # Explicit init/shutdown rather than `with rclpy.init()`, which only newer rclpy has
    # (Jazzy robots run this node too).
    try:
        try:
            rclpy.init(args=args)
        except Exception as exc:  # noqa: BLE001 - e.g. a bad --params-file: one line, no trace
            rclpy.logging.get_logger(NODE_NAME).fatal(
                f'cannot start: {str(exc).strip().splitlines()[-1]}')
            return 1
        try:
            node = node_class()
        except (ValueError, ImportError, WeightsError, OSError, ParameterException) as exc:
            rclpy.logging.get_logger(NODE_NAME).fatal(f'cannot start: {exc}')
            return 1
        executor = MultiThreadedExecutor(num_threads=4)
        executor.add_node(node)
        try:
            executor.spin()
        finally:
            node.destroy_node()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
