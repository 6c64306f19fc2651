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
"""``~/map`` and ``~/save``: the accumulated point-cloud map of the node (docs/map.md).

:class:`MapOutput` has the interface of the other outputs (``publish(pred, camera_frame, opts)``
on the worker thread for every published prediction, ``clear()`` on every session reset):

- every published pose is logged for ``trajectory.tum``;
- with ``map.enable`` true, a keyframe that carries depth (``stream.enable_depth``) goes into
  the :class:`~lingbot_map_ros.engine.map.map_accumulator.MapAccumulator`, on the engine's device:
  its points in odom are ``FramePrediction.points``, the same unprojection ``~/cloud`` uses;
- a steady-clock timer publishes ``~/map`` (reliable, transient local, keep last 1: a late
  subscriber gets the latest map) every ``map.period_s`` when the map changed;
- ``~/save`` (std_srvs/Trigger) writes the trajectory, the map and the intrinsics into a new
  folder under ``output.directory`` (:mod:`~lingbot_map_ros.ros.publishers.map_save`).

The map is in ``frames.odom_frame``, the continuous frame of the poses (REP 105,
``odom_frames.py``): the camera's pose in it comes from the engine's continuous ``c2w`` through
the same :class:`~lingbot_map_ros.ros.publishers.odom_frames.OdomFrames` as ``~/pose``, so
rollovers do not tear it. With loop closure (:meth:`MapOutput.follow` a ``LoopOutput`` that is
active) the map is in ``frames.map_frame`` instead and made of keyframe-anchored pieces
(:class:`~lingbot_map_ros.engine.map.anchored_map.AnchoredMap`): each keyframe's points in its
camera frame, placed by the keyframe's pose in ``map`` (the odometry pose times ``map -> odom``
when it is added; its pose in the pose graph once a correction changed the graph). The timer
re-places every piece after each correction, so a revisited place is not drawn twice.

The logged trajectory is what ``~/pose`` carried (``base_frame`` in odom). A session reset
starts a new map (new origin and scale), so the map and the logged poses are cleared.
"""

from __future__ import annotations

from pathlib import Path
import threading
import time
from typing import Any, Callable

from lingbot_map_ros.config import MapConfig
from lingbot_map_ros.engine.map.anchored_map import AnchoredMap
from lingbot_map_ros.engine.map.map_accumulator import MapAccumulator
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.parameters.node_options import NodeOptions
from lingbot_map_ros.ros.publishers.anchored_pieces import AnchoredPieces
from lingbot_map_ros.ros.publishers.callback_guard import guard_service, guard_timer
from lingbot_map_ros.ros.publishers.grid_output import GridOutput
from lingbot_map_ros.ros.publishers.map_save import CameraEstimate, save, SaveSnapshot
from lingbot_map_ros.ros.publishers.odom_frames import OdomFrames
import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos import qos_profile_services_default
from sensor_msgs.msg import PointCloud2, PointField
from std_srvs.srv import Trigger
import torch

MAP_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                     reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL)
"""QoS of ~/map: a late (transient local) subscriber still gets the latest map."""
_FIELDS = [PointField(name=n, offset=4 * i, datatype=PointField.FLOAT32, count=1)
           for i, n in enumerate(('x', 'y', 'z', 'rgb'))]


class PoseLog:
    """Stamped poses in a ring buffer of at most ``output.max_poses`` (104 bytes a pose).

    The buffer grows by doubling up to the cap; past it the oldest pose falls out (counted in
    ``dropped``). ``clear`` gives the memory back.
    """

    _INITIAL = 256

    def __init__(self) -> None:
        self.clear()

    def append(self, stamp_ns: int, c2w: np.ndarray, cap: int) -> int:
        """Log a pose; returns how many old poses fell out to stay within ``cap``."""
        size = len(self._stamps)
        fell_out = max(self._count - cap + 1, 0)
        if fell_out:
            self._start = (self._start + fell_out) % size
            self._count -= fell_out
            self.dropped += fell_out
        if self._count == size:
            new = min(2 * size, cap)
            order = self._order()
            self._stamps = np.concatenate([self._stamps[order], np.zeros(new - size, np.int64)])
            self._poses = np.concatenate([self._poses[order], np.zeros((new - size, 3, 4))])
            self._start, size = 0, new
        index = (self._start + self._count) % size
        self._stamps[index], self._poses[index] = stamp_ns, c2w[:3]
        self._count += 1
        return fell_out

    @property
    def capacity(self) -> int:
        """Poses the buffer holds now before it grows (at most the cap)."""
        return len(self._stamps)

    def _order(self) -> np.ndarray:
        return (self._start + np.arange(self._count)) % len(self._stamps)

    def clear(self) -> None:
        self._stamps = np.zeros(self._INITIAL, np.int64)
        self._poses = np.zeros((self._INITIAL, 3, 4), np.float64)
        self._start = self._count = 0
        self.dropped = 0

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``([N] stamps, [N, 4, 4] poses)`` copies, oldest first."""
        order = self._order()
        c2w = np.zeros((self._count, 4, 4))
        c2w[:, :3], c2w[:, 3, 3] = self._poses[order], 1.0
        return self._stamps[order], c2w


class MapOutput:
    """The map publisher, the save service and what they need (see the module docstring)."""

    def __init__(self, node: Any, options: NodeOptions, device: str, frames: OdomFrames,
                 frame_ids: dict[str, str], service_qos: QoSProfile | None = None) -> None:
        """Create the accumulator, ``~/map``, ``~/save`` and the publish timer.

        Args:
            node: the ``rclpy`` node.
            options: the node options at start (``set_options`` replaces them).
            device: torch device of the engine.
            frames: the odom frame of ``~/pose`` (shared with ``Outputs``).
            frame_ids: ``odom_frame`` and ``base_frame`` (``Outputs.frames_info()``).
            service_qos: QoS of ``~/save``; the node passes the one of ``~/reset``, deep
                enough that every caller of a burst is answered.

        Raises:
            ValueError: a bad ``map.*`` value.
        """
        self._options = options
        self._log = node.get_logger()
        self._frame_id = frame_ids['odom_frame']
        self._odom_frame = self._frame_id
        self._base_frame = frame_ids['base_frame']
        self._frames = frames
        self._map = MapAccumulator(options.map_config, device)
        self._device = device
        self._pieces: AnchoredPieces | None = None
        """The anchored map and its keyframes, with loop closure (:meth:`follow`)."""
        self._lock = threading.Lock()
        self._poses = PoseLog()
        self._camera: CameraEstimate | None = None
        self._stamp_ns = 0
        self._changed = False
        self._add_ms: list[float] = []
        self._pub = node.create_publisher(PointCloud2, '~/map', MAP_QOS)
        self._node = node
        log = node.get_logger()
        self._srv = node.create_service(Trigger, '~/save',
                                        guard_service(log, '~/save', self._on_save),
                                        qos_profile=service_qos or qos_profile_services_default,
                                        callback_group=MutuallyExclusiveCallbackGroup())
        self._timer = node.create_timer(options.map_config.period_s,
                                        guard_timer(log, '~/map', self._publish_if_changed),
                                        callback_group=MutuallyExclusiveCallbackGroup(),
                                        clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.grid = GridOutput(node, options.grid_config, self._frame_id) \
            if options.grid_config.enable else None
        """``~/grid``, fed with the keyframes ``~/map`` takes (``grid.enable``), else None."""

    def destroy(self) -> None:
        """Remove ``~/map``, ``~/save`` and the timer, and free the map (lifecycle cleanup)."""
        self._node.destroy_timer(self._timer)
        self._node.destroy_service(self._srv)
        self._node.destroy_publisher(self._pub)
        self._map.clear()
        if self._pieces is not None:
            self._pieces.clear()
        if self.grid is not None:
            self.grid.destroy()

    @property
    def accumulator(self) -> MapAccumulator:
        """Return the map itself (for tests and tools)."""
        return self._map

    @property
    def published_stamp_ns(self) -> int | None:
        """Return the stamp of the map last published, None while a change waits for the timer."""
        with self._lock:
            return None if self._changed else self._stamp_ns

    @property
    def anchored(self) -> AnchoredMap | None:
        """Return the keyframe-anchored map (loop closure on), else None."""
        return None if self._pieces is None else self._pieces.map

    @property
    def in_map_frame(self) -> bool:
        """Return whether ``~/map`` is in ``frames.map_frame`` (loop closure on)."""
        return self._pieces is not None

    @property
    def graph_key(self) -> tuple | None:
        """Return the loop closer's state the pieces were last placed by (tests)."""
        return None if self._pieces is None else self._pieces.graph_key

    def follow(self, loop_output: Any) -> None:
        """Build ``~/map`` from keyframe-anchored pieces in ``map`` when loop closure is active.

        Called once before the first frame (``map_reuse.MapReuse``); ``loop_output`` is the
        node's ``LoopOutput``. Without an active one (loop closure off, no map frame) the map
        stays the odom accumulator.
        """
        if loop_output is None or not loop_output.active:
            return
        self._pieces = AnchoredPieces(AnchoredMap(self._options.map_config, self._device),
                                      loop_output)
        self._frame_id = loop_output.map_frame
        if self.grid is not None:
            self.grid.frame_id = self._frame_id

    def set_options(self, options: NodeOptions) -> None:
        """Use ``options`` from now on (``map.*`` live settings, ``output.directory``)."""
        self._options = options

    def publish(self, pred: FramePrediction, camera_frame: str, opts: NodeOptions) -> None:
        """Log the published pose and add a keyframe's depth to the map (worker thread).

        Runs after ``Outputs.publish``, which anchored the odom frame on the first pose.
        """
        self.log_pose(pred, camera_frame, self._frames.base_in_odom(pred.c2w), opts)
        if self._pieces is None:
            self.add_keyframe(pred, self._frames.odom_from_world, opts)
        else:
            self._add_piece(pred, opts)

    def log_pose(self, pred: FramePrediction, camera_frame: str, base_in_odom: np.ndarray,
                 opts: NodeOptions) -> None:
        """Log the pose ``~/pose`` carried for ``pred``, for ``~/save``."""
        with self._lock:
            fell_out = self._poses.append(pred.stamp_ns, base_in_odom, opts.max_poses)
            self._camera = CameraEstimate(camera_frame, pred.stamp_ns, pred.intrinsics_original,
                                          pred.original_size_hw, pred.intrinsics,
                                          pred.image_size_hw)
        if fell_out:
            self._log.warning(f'~/save keeps the last {opts.max_poses} poses '
                              f'(output.max_poses): {self._poses.dropped} older poses dropped '
                              'from the saved trajectory so far', throttle_duration_sec=60.0)

    def add_keyframe(self, pred: FramePrediction, odom_from_world: Callable[[], np.ndarray],
                     opts: NodeOptions) -> None:
        """Add a keyframe's depth to the map (map enabled, depth on), its points in odom.

        Args:
            pred: the prediction.
            odom_from_world: returns ``T_odom_world`` of the prediction's camera (a similarity
                for a camera of several), called only for a keyframe that is added.
            opts: the node options (``map.*``).
        """
        if not (opts.map_config.enable and pred.is_keyframe and pred.depth is not None):
            return
        try:
            self._add(pred, opts.map_config, odom_from_world())
        except (ValueError, RuntimeError) as exc:  # a bad frame must not stop the node
            self._log.error(f'map: keyframe at stamp {pred.stamp_ns} not added: {exc}',
                            throttle_duration_sec=5.0)

    def _add(self, pred: FramePrediction, config: MapConfig, odom_from_world: np.ndarray
             ) -> None:
        if config != self._map.config:
            self._map.config = config
        if self._map.num_keyframes == 0:  # once per map: a host sync is fine here
            self._log_new_map(pred, config)
        start = time.perf_counter()
        update = self._map.add_points(pred.points(odom_from_world), pred.depth,
                                      pred.depth_conf, pred.image)
        self._add_ms.append((time.perf_counter() - start) * 1e3)
        self._add_to_grid(pred, config, lambda: odom_from_world @ np.asarray(pred.c2w), None)
        with self._lock:
            self._stamp_ns, self._changed = pred.stamp_ns, True
        if update.num_dropped or update.num_out_of_range:
            self._log.debug(f'map: {update}')

    def _log_new_map(self, pred: FramePrediction, config: MapConfig) -> None:
        valid = torch.isfinite(pred.depth) & (pred.depth > 0)
        median = float(torch.where(valid, pred.depth, torch.nan).nanmedian())
        self._log.info(f'map: new map; median depth of its first keyframe {median:.4g} map '
                       f'units, map.voxel_size {config.voxel_size:g} = 1/'
                       f'{median / config.voxel_size:.0f} of it')

    def _add_piece(self, pred: FramePrediction, opts: NodeOptions) -> None:
        """Add a keyframe's piece to the anchored map (loop closure on; worker thread)."""
        config = opts.map_config
        if not (config.enable and pred.is_keyframe and pred.depth is not None):
            return
        try:
            pieces = self._pieces
            if config != pieces.map.config:
                pieces.map.config = config
            if pieces.map.num_pieces == 0 and pieces.next_id == 0:
                self._log_new_map(pred, config)
            start = time.perf_counter()
            update = pieces.add(pred)
            self._add_ms.append((time.perf_counter() - start) * 1e3)
            if update.num_non_finite or update.num_too_far:
                self._log.warning(f'map: keyframe at stamp {pred.stamp_ns}: '
                                  f'{update.num_non_finite} non-finite and {update.num_too_far} '
                                  'too distant points dropped (counted)',
                                  throttle_duration_sec=10.0)
        except (ValueError, RuntimeError) as exc:  # a bad frame must not stop the node
            self._log.error(f'map: keyframe at stamp {pred.stamp_ns} not added: {exc}',
                            throttle_duration_sec=5.0)
            return
        piece_id = pieces.next_id - 1
        self._add_to_grid(pred, config, lambda: pieces.map.poses().get(piece_id), piece_id)
        with self._lock:
            self._stamp_ns, self._changed = pred.stamp_ns, True

    def _add_to_grid(self, pred: FramePrediction, config: MapConfig,
                     pose: Callable[[], np.ndarray | None], piece_id: int | None) -> None:
        """Give ``~/grid`` the keyframe ``~/map`` took, with its camera's pose in the map."""
        if self.grid is None:
            return
        try:
            self.grid.add(pred, pose(), config, piece_id)
        except (ValueError, RuntimeError) as exc:  # a bad frame must not stop the node
            self._log.error(f'grid: keyframe at stamp {pred.stamp_ns} not added: {exc}',
                            throttle_duration_sec=5.0)

    def save_grid(self, folder: str | Path) -> tuple[Path, Path] | None:
        """Write ``~/grid`` as map-server files into ``folder``; None without a grid."""
        return None if self.grid is None else self.grid.save(folder)

    def grid_files(self) -> dict[str, bytes]:
        """Return ``~/grid``'s map-server files by name for a saved map; empty without a grid."""
        return {} if self.grid is None else self.grid.files()

    def clear(self) -> int:
        """Start a new map (session reset); returns the map points removed."""
        removed = self._map.clear()
        if self._pieces is not None:
            removed += self._pieces.clear()
        if self.grid is not None:
            self.grid.clear()
        with self._lock:  # after the clear, so the next publish is the empty map
            self._poses.clear()
            self._changed = True
        if self._add_ms:
            self._log.info(f'map: {removed} points cleared; adding a keyframe took '
                           f'{np.mean(self._add_ms):.2f} ms on average '
                           f'({len(self._add_ms)} keyframes)')
            self._add_ms.clear()
        return removed

    def _publish_if_changed(self) -> None:
        if self._pieces is not None:
            try:
                moved = self._pieces.follow_graph()
            except Exception as exc:  # noqa: BLE001 - a timer must not stop the node
                moved = False
                self._log.error(f'map: pieces not moved after a correction: {exc}',
                                throttle_duration_sec=10.0)
            if moved:
                with self._lock:
                    self._changed = True
                if self.grid is not None:  # rebuilt on the grid's own timer
                    self.grid.follow(self._pieces.map.poses())
        with self._lock:
            if not self._changed:
                return
            self._changed = False
            stamp_ns = self._stamp_ns
        try:
            self._pub.publish(self.cloud(stamp_ns))
        except Exception as exc:  # noqa: BLE001 - a failed publish must not stop the timer
            self._log.error(f'map: publish failed: {exc}', throttle_duration_sec=10.0)

    def cloud(self, stamp_ns: int) -> PointCloud2:
        """Return the current map as a PointCloud2 (x y z + packed rgb) in its frame."""
        xyz, rgb = self._points()
        num, data = conversions.xyz_rgb_cloud(xyz[:, None], rgb[:, None], 1)
        msg = PointCloud2(height=1, width=num, fields=_FIELDS, is_bigendian=False,
                          point_step=16, row_step=16 * num, is_dense=True)
        msg.header.frame_id = self._frame_id
        conversions.fill_stamp(msg.header.stamp, stamp_ns)
        msg.data = data
        return msg

    def snapshot(self) -> SaveSnapshot:
        """Return the poses, the map and the camera as of now."""
        with self._lock:
            stamps, c2w = self._poses.arrays()
            camera, dropped = self._camera, self._poses.dropped
        xyz, rgb = self._points()
        which = f'the last {len(stamps)} poses ({dropped} older dropped, output.max_poses)' \
            if dropped else 'every pose'
        comments = (f'lingbot_map ~/save: {which} published on ~/pose since the map was '
                    f'last cleared; {self._base_frame} in {self._odom_frame}; metres with '
                    'metric.source depth (see metric.state), else model units',)
        return SaveSnapshot(stamps, c2w, xyz, rgb, camera, comments)

    def _points(self) -> tuple[np.ndarray, np.ndarray]:
        """Return the published map: the anchored one with loop closure, else the odom one."""
        return self._map.points() if self._pieces is None else self._pieces.map.points()

    def _on_save(self, request: Trigger.Request, response: Trigger.Response
                 ) -> Trigger.Response:
        directory = self._options.output_directory
        try:
            snapshot = self.snapshot()
            folder = save(directory, snapshot)
            self.save_grid(folder)
        except Exception as exc:  # noqa: BLE001 - answer the caller, never raise
            response.success = False
            response.message = f"save into '{directory}' failed: {exc}"
            self._log.error(response.message)
            return response
        response.success, response.message = True, str(folder)
        self._log.info(f'saved {len(snapshot.stamps_ns)} poses and {len(snapshot.xyz)} map '
                       f'points to {folder}')
        return response
