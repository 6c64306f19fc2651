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
"""Map reuse in the node: ``~/save_map``, ``~/load_map``, ``~/localize_in_map``, ``map.load_path``.

The keyframe map (``engine/mapping/store/map_store.py``) is the loop closer's keyframes,
descriptors, pose graph and images, plus the point map. The loaded map, its mode and what was asked
of it belong to the mapping back end (``engine/mapping/backend.py``); this file is its ROS side:
the services, ``/initialpose``, the parameters, and the point map and frames of a save. Every
callback is guarded (``callback_guard.py``). The services follow ``~/save``: the path is a
parameter and the call is a ``std_srvs/Trigger`` answered with ``success`` and the folder or the
reason (no message package of the node's dependencies has a service that takes a path and answers a
reason):

- ``~/save_map`` writes into ``map.save_path`` (``''``: ``<output.directory>/map``);
  it and ``~/load_map`` run on a thread of their own, one at a time, and answer when done
  without holding an executor thread (``callback_guard.guard_job``); ``~/map_job`` (latched
  ``std_msgs/String``) says ``<service>: running`` and then ``done`` or ``refused`` with the
  answer;
- ``~/load_map`` reads ``map.load_path`` with ``map.mode``; the map is validated completely
  (version, checksums, model hash, image size when a frame has set it, bounds) before the
  running one is replaced, and a refused one leaves everything as it was;
- ``~/localize_in_map`` (``nav_msgs/SetMap``; its ``map`` is ignored) searches again, with
  ``initial_pose`` as a hint when its frame is set: only map keyframes within three standard
  deviations (at least :data:`MIN_HINT_RADIUS`) of it are candidates for the first match;
- ``/initialpose`` (RViz's "2D Pose Estimate") does the same; the pose must be in
  ``frames.map_frame``.

At start a ``map.load_path`` that is refused is logged with the reason and the node runs
without a map (``map_state`` ``none`` and ``map_error`` in the ``loop`` status; with
``map.mode`` ``localization`` it stays not localized: ``refused``, nothing in ``map``). The
processed image size of a map loaded before the first frame is checked when the first loop
closer starts (the first keyframe); a mismatch drops the map with the reason.

Frames: a map is published where it was made. It keeps ``frame_from_graph``, the mapping run's
``T_odom_world`` anchor (``odom_frames.py``): the loaded graph's frame is carried into ROS
``map`` by that anchor, while ``odom`` keeps the running session's own.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from geometry_msgs.msg import PoseWithCovarianceStamped
from lingbot_map_ros.config import MetricConfig
from lingbot_map_ros.engine.mapping.backend import MappingBackend
from lingbot_map_ros.engine.mapping.loop_closer import LoopCloser
from lingbot_map_ros.engine.mapping.store.map_format import (MapExpectation, MapSnapshot,
                                                             model_hash, ModelIdentity)
from lingbot_map_ros.engine.mapping.store.map_store import remove_stale_saves
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.ros.parameters.save_directory import resolve_directory
from lingbot_map_ros.ros.publishers.callback_guard import (bounded, guard_job, guard_service,
                                                           guard_timer, log_outcome)
from lingbot_map_ros.ros.publishers.loop_outputs import LoopOutput
from lingbot_map_ros.ros.publishers.map_output import MapOutput
from lingbot_map_ros.ros.publishers.outputs import Outputs
from lingbot_map_ros.ros.publishers.service_qos import service_qos
from nav_msgs.srv import SetMap
import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.qos import DurabilityPolicy, QoSProfile
from std_msgs.msg import String
from std_srvs.srv import Trigger

MIN_HINT_RADIUS = 1.0
"""Least radius of a pose hint (map units)."""
SNAPSHOT_TIMEOUT_S = 60.0
"""Longest wait of ``~/save_map`` for the loop closer's worker (one verification at most)."""


class MapReuse:
    """The map services of the node; the map itself is the back end's (module docstring)."""

    def __init__(self, node: Any, values: dict[str, Any], session: RolloverSession,
                 loop_output: LoopOutput, map_output: MapOutput | None, outputs: Outputs) -> None:
        """Create the services; load ``map.load_path`` when set.

        Args:
            node: the rclpy node (its ``map.*`` parameters are read at each call).
            values: parameter values at start.
            session: the node's ``RolloverSession`` (engine weights, processed image size).
            loop_output: the node's ``LoopOutput`` (its feed holds the mapping back end).
            map_output: the node's ``MapOutput`` (the point map), or None.
            outputs: the node's ``Outputs`` (the odom anchor of the running session).
        """
        self._frames = outputs.frames
        self._node = node
        self._session = session
        self._feed = loop_output.feed
        self._backend: MappingBackend = loop_output.feed.backend
        self._map_from_odom: Callable[[], np.ndarray] = loop_output.map_from_odom
        self._points = map_output
        self._metric = MetricConfig.from_flat(values).enabled
        self._map_frame = values['frames.map_frame']
        if map_output is not None:  # ~/map in map, from anchored pieces, with loop closure
            map_output.follow(loop_output)
        # The jobs are coroutines that hold their group until they end: a reentrant group (the
        # jobs' lock keeps one at a time), the rest in a group of their own.
        jobs_group, group = ReentrantCallbackGroup(), MutuallyExclusiveCallbackGroup()
        log = node.get_logger()
        self._job_pub = node.create_publisher(
            String, '~/map_job', QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        jobs = threading.Lock()  # one save or load at a time

        def job(name: str, work: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
            return guard_job(log, name, work, lambda: node.executor, jobs, self._progress)
        self._services = [
            node.create_service(Trigger, '~/save_map', job('~/save_map', self._on_save),
                                qos_profile=service_qos(), callback_group=jobs_group),
            node.create_service(Trigger, '~/load_map', job('~/load_map', self._on_load),
                                qos_profile=service_qos(), callback_group=jobs_group),
            node.create_service(SetMap, '~/localize_in_map',
                                guard_service(log, '~/localize_in_map', self._on_localize),
                                qos_profile=service_qos(), callback_group=group)]
        # RViz's "2D Pose Estimate" (and nav2's initial pose) seed a search, as
        # ~/localize_in_map does; the global name is what those tools publish on.
        self._initial_pose = node.create_subscription(
            PoseWithCovarianceStamped, '/initialpose',
            guard_timer(log, '/initialpose', self._on_initial_pose), 10, callback_group=group)
        self._clean_stale_saves(values)
        path = values['map.load_path']
        if path:
            ok, message = self.load(path, values['map.mode'])
            log_outcome(log, ok, message if ok else f'{message}; starting without a map')

    def destroy(self) -> None:
        """Remove the services and the subscription."""
        for service in self._services:
            self._node.destroy_service(service)
        self._node.destroy_subscription(self._initial_pose)
        self._node.destroy_publisher(self._job_pub)

    def _clean_stale_saves(self, values: dict[str, Any]) -> None:
        """Remove what saves killed in an earlier run left beside the save folder."""
        try:
            path = values['map.save_path']
            folder = resolve_directory(path) if path else \
                resolve_directory(values['output.directory']) / 'map'
            removed = remove_stale_saves(folder)
        except (OSError, ValueError):
            return  # the save itself reports a bad folder, with its reason
        if removed:
            self._node.get_logger().info(
                f'removed {len(removed)} unfinished map save(s) beside {folder}')

    def _progress(self, text: str) -> None:
        """Publish a map job's progress on ``~/map_job`` (latched)."""
        self._job_pub.publish(String(data=text))

    # -- loading and saving ---------------------------------------------------------------

    def load(self, path: str, mode: str, matches: int | None = None) -> tuple[bool, str]:
        """Validate the map at ``path`` and make it the running map (at the next keyframe).

        Args:
            path: the map folder.
            mode: 'mapping' or 'localization'.
            matches: agreeing matches that localize (``map.localize_matches``; None keeps).

        Returns:
            (True, what was loaded) or (False, the reason; the running map is kept, and
            without one a map to localize in leaves the node publishing nothing in map).
        """
        if mode not in ('mapping', 'localization'):
            return False, f"map.mode={mode!r} must be 'mapping' or 'localization'"
        feed = self._feed
        if feed.state != 'running':
            return False, f'loop closure is {feed.state} ({feed.reason}): no map can be used'
        try:
            folder = resolve_directory(path)
            size = self._session.session.stats().image_size_hw
            expect = MapExpectation(model_hash(self._weights()), tuple(size) if size else None,
                                    identity=self._identity())
            loaded = self._backend.load(folder, expect, mode, matches)
        except Exception as exc:  # noqa: BLE001 - MapLoadError or any other: an answer
            reason = bounded(f'map {path!r} refused: {exc}')
            self._backend.refuse(reason)
            return False, reason
        graph = loaded.graph
        return True, (f'loaded {folder}: {graph.num_keyframes} keyframes, '
                      f'{len(graph.edges_ij)} edges, {len(loaded.points_xyz)} points; '
                      f'mode {mode}, searching')

    def save(self, path: str) -> tuple[bool, str]:
        """Write the running map to ``path`` ('' : ``<output.directory>/map``).

        Returns:
            (True, the folder and counts) or (False, the reason).
        """
        try:
            folder = resolve_directory(path) if path else \
                resolve_directory(self._param('output.directory')) / 'map'
            snapshot = self._snapshot()
            self._backend.save(folder, snapshot)
        except Exception as exc:  # noqa: BLE001 - a failed save is an answer, never a raise
            return False, bounded(f'save_map failed: {exc or type(exc).__name__}')
        graph = snapshot.graph
        return True, (f'{folder} ({graph.num_keyframes} keyframes, {len(graph.edges_ij)} '
                      f'edges, {len(graph.images)} images, {len(snapshot.points_xyz)} points)')

    def _snapshot(self) -> MapSnapshot:
        graph, loaded = self._backend.graph_snapshot(SNAPSHOT_TIMEOUT_S)
        if graph is None:
            raise RuntimeError('no keyframes yet (loop closure off or no frame)')
        if loaded is not None and graph is loaded.graph:  # localization: the map unchanged
            return loaded
        frames = self._frames
        if loaded is None and not frames.anchored:
            raise RuntimeError('no keyframes yet')
        # This run's map: odom's anchor, turned by the IMU's levelling of map when it levelled
        # map rather than odom (identity otherwise), as ~/map_pose and ~/map are.
        frame = loaded.frame_from_graph if loaded is not None else \
            frames.map_level() @ frames.odom_from_world()
        xyz, rgb = self._map_points(loaded, self._backend.closer)
        size = self._session.session.stats().image_size_hw
        if size is None:
            raise RuntimeError('no frame processed yet (the image size is unknown)')
        return MapSnapshot(graph=graph, model_hash=model_hash(self._weights()),
                           image_size_hw=tuple(size), intrinsics_source='model',
                           metric=self._metric, points_xyz=xyz, points_rgb=rgb,
                           frame_from_graph=frame, identity=self._identity(),
                           extra_files=self._points.grid_files() if self._points else {})

    def _map_points(self, loaded: MapSnapshot | None, closer: LoopCloser | None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Return the loaded map's points and this run's (``~/map``) in map.

        ``~/map`` is in map already when built from anchored pieces; an odom map is carried
        into map by the latest TF map -> odom.
        """
        parts = [] if loaded is None else [(loaded.points_xyz, loaded.points_rgb)]
        tied = loaded is None or (closer is not None and closer.map_state == 'localized')
        if self._points is not None and tied:
            points = self._points.snapshot()
            transform = np.eye(4) if self._points.in_map_frame else self._map_from_odom()
            xyz = points.xyz @ transform[:3, :3].T + transform[:3, 3]
            parts.append((xyz.astype(np.float32), np.asarray(points.rgb, np.uint8)))
        if not parts:
            return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8)
        return (np.concatenate([p[0] for p in parts]).astype(np.float32),
                np.concatenate([p[1] for p in parts]).astype(np.uint8))

    def _weights(self) -> str:
        return str(self._session.session.engine.weights)

    def _identity(self) -> ModelIdentity:
        return ModelIdentity.of(self._session.session.engine.config)

    # -- services -------------------------------------------------------------------------

    def _param(self, name: str) -> Any:
        return self._node.get_parameter(name).value

    def _on_save(self, request: Trigger.Request, response: Trigger.Response
                 ) -> Trigger.Response:
        response.success, response.message = self.save(self._param('map.save_path'))
        log_outcome(self._node.get_logger(), response.success, f'~/save_map: {response.message}')
        return response

    def _on_load(self, request: Trigger.Request, response: Trigger.Response
                 ) -> Trigger.Response:
        path = self._param('map.load_path')
        if not path:
            response.success, response.message = False, 'map.load_path is empty: set it first'
            return response
        response.success, response.message = self.load(
            path, self._param('map.mode'), self._param('map.localize_matches'))
        log_outcome(self._node.get_logger(), response.success, f'~/load_map: {response.message}')
        return response

    def _on_localize(self, request: SetMap.Request, response: SetMap.Response
                     ) -> SetMap.Response:
        # SetMap's answer has no message: a refusal's reason is logged and shown as the
        # ``loop`` status's ``map_error``.
        response.success = self._search('~/localize_in_map', request.initial_pose)
        return response

    def _on_initial_pose(self, msg: PoseWithCovarianceStamped) -> None:
        self._search('/initialpose', msg)

    def _search(self, source: str, pose: PoseWithCovarianceStamped) -> bool:
        """Search the loaded map again, near ``pose`` when its frame is set; False: refused."""
        log = self._node.get_logger()
        hint, reason = self._hint_of(pose)
        if not reason:
            try:
                self._backend.localize(hint, int(self._param('map.localize_matches')))
            except RuntimeError as exc:  # no map loaded meanwhile
                reason = str(exc)
        if reason:
            self._backend.refuse(bounded(f'{source} refused: {reason}'))
            log.error(f'{source}: {reason}')
            return False
        log.info(f'{source}: searching' + (
            f' within {hint[1]:.2f} of ({hint[0][0]:.2f}, {hint[0][1]:.2f}, '
            f'{hint[0][2]:.2f}) in the map graph' if hint else ''))
        return True

    def _hint_of(self, pose: PoseWithCovarianceStamped
                 ) -> tuple[tuple[np.ndarray, float] | None, str]:
        """Return (the search hint of a ``PoseWithCovarianceStamped``, '') or (None, why not).

        A pose without a frame is no hint; one in another frame than ``frames.map_frame`` is
        refused. The hint is in the loaded map's graph frame.
        """
        loaded = self._backend.loaded
        if loaded is None:
            return None, 'no map loaded (set map.load_path, call ~/load_map)'
        frame = pose.header.frame_id
        if not frame:
            return None, ''
        if frame.lstrip('/') != self._map_frame:
            return None, (f'the pose is in frame {bounded(frame, 80)!r}; give it in '
                          f'{self._map_frame!r} (frames.map_frame)')
        p = pose.pose.pose.position
        cov = np.asarray(pose.pose.covariance, np.float64).reshape(6, 6)
        radius = max(3.0 * float(np.sqrt(max(cov[0, 0], cov[1, 1], 0.0))), MIN_HINT_RADIUS)
        graph_from_frame = np.linalg.inv(loaded.frame_from_graph)
        position = graph_from_frame[:3, :3] @ [p.x, p.y, p.z] + graph_from_frame[:3, 3]
        if not (np.isfinite(position).all() and np.isfinite(radius)):
            return None, 'the pose hint is not finite'
        return (position, radius), ''
