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
"""``~/grid`` and ``~/grid_metadata``: the 2D occupancy grid for nav2 (docs/map.md).

:class:`GridOutput` belongs to the node's ``map_output.MapOutput``, which feeds it every keyframe
it puts into ``~/map``: the keyframe's confident depth (the pixels ``~/map`` keeps) in its camera
frame, and its camera's pose in the map's frame (``frames.odom_frame``, or ``frames.map_frame``
with loop closure, where the pose is its anchored piece's, so a correction moves the grid too).
Storing a keyframe is cheap (the worker thread); the ray tracing runs on this output's steady
timer every ``grid.period_s``, and after a correction the timer rebuilds the grid once
(:class:`~lingbot_map_ros.engine.map.occupancy_grid.OccupancyGrid`). Both topics are reliable,
transient local, keep last 1, as ``~/map``: a map server's client or RViz starting late gets
the latest grid.
"""

from __future__ import annotations

from pathlib import Path
import threading
from typing import Any

from lingbot_map_ros.config import GridConfig, MapConfig
from lingbot_map_ros.engine.map.grid_cells import GridView
from lingbot_map_ros.engine.map.grid_files import map_server_files, write_map_server
from lingbot_map_ros.engine.map.occupancy_grid import camera_points, OccupancyGrid
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.publishers.callback_guard import guard_timer
from nav_msgs.msg import MapMetaData, OccupancyGrid as GridMsg
import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

GRID_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)
"""QoS of ~/grid and ~/grid_metadata: a late (transient local) subscriber gets the latest."""
GRID_FILE_STEM = 'grid'
"""A saved map folder holds the grid as ``grid.yaml`` + ``grid.pgm``."""


class GridOutput:
    """The occupancy grid, its publishers and its timer (see the module docstring)."""

    def __init__(self, node: Any, config: GridConfig, frame_id: str) -> None:
        """Create the grid, ``~/grid``, ``~/grid_metadata`` and the update timer.

        Args:
            node: the ``rclpy`` node.
            config: ``grid.*`` (checked when the node declared it).
            frame_id: the frame of the grid (``~/map``'s).
        """
        self._node = node
        self._log = node.get_logger()
        self.frame_id = frame_id
        self.grid = OccupancyGrid(config)
        self._lock = threading.Lock()
        self._next_id = 0
        self._stamp_ns = 0
        self._dropped_seen = 0
        self._pub = node.create_publisher(GridMsg, '~/grid', GRID_QOS)
        self._meta_pub = node.create_publisher(MapMetaData, '~/grid_metadata', GRID_QOS)
        self._timer = node.create_timer(config.period_s,
                                        guard_timer(node.get_logger(), '~/grid',
                                                    self.publish_if_changed),
                                        callback_group=MutuallyExclusiveCallbackGroup(),
                                        clock=Clock(clock_type=ClockType.STEADY_TIME))

    def destroy(self) -> None:
        """Remove the publishers and the timer and free the grid (lifecycle cleanup)."""
        self._node.destroy_timer(self._timer)
        self._node.destroy_publisher(self._pub)
        self._node.destroy_publisher(self._meta_pub)
        self.grid.clear()

    def add(self, pred: FramePrediction, pose: np.ndarray | None, map_config: MapConfig,
            keyframe_id: int | None = None) -> None:
        """Store a keyframe's confident depth with its camera's pose (worker thread).

        Args:
            pred: a keyframe with depth.
            pose: [4, 4] the camera (optical) in the grid's frame, or None (not placed yet).
            map_config: the pixel filters of ``~/map`` (stride, confidence).
            keyframe_id: the anchored piece's id (loop closure: its pose follows the graph),
                or None for the next id of this output's own.

        Raises:
            ValueError: a malformed pose or depth (nothing is stored).
        """
        kept = camera_points(pred.depth, pred.depth_conf, pred.intrinsics, map_config)
        with self._lock:
            if keyframe_id is None:
                keyframe_id = self._next_id
            self._next_id = keyframe_id + 1
            self._stamp_ns = pred.stamp_ns
        self.grid.add(keyframe_id, kept, pose)

    def follow(self, poses: dict[int, np.ndarray | None]) -> int:
        """Give the keyframes their poses after a correction; returns how many moved."""
        placed = [(k, p) for k, p in poses.items() if p is not None]
        return self.grid.set_poses([k for k, _ in placed],
                                   np.reshape([p for _, p in placed], (len(placed), 4, 4)))

    def clear(self) -> None:
        """Start a new grid (session reset)."""
        self.grid.clear()
        with self._lock:
            self._next_id = 0
            self._dropped_seen = 0

    def publish_if_changed(self) -> None:
        """Trace new keyframes (or rebuild after a correction) and publish when changed."""
        try:
            if not self.grid.update():
                return
            self._warn_if_bounded()
            with self._lock:
                stamp_ns = self._stamp_ns
            msg = self.message(self.grid.view(), stamp_ns)
            self._pub.publish(msg)
            self._meta_pub.publish(msg.info)
        except Exception as exc:  # noqa: BLE001 - a timer must not stop the node
            self._log.error(f'grid: update or publish failed: {exc}', throttle_duration_sec=10.0)

    def _warn_if_bounded(self) -> None:
        """Log (throttled) when the bounds dropped keyframes or cells since the last check."""
        stats = self.grid.stats()
        dropped = stats['num_dropped_far'] + stats['num_dropped_old'] + \
            stats['num_cells_outside']
        if dropped > self._dropped_seen:
            self._log.warning(
                f'grid: bounds reached (grid.max_cells {self.grid.config.max_cells}): '
                f"{stats['num_dropped_far']} farthest and {stats['num_dropped_old']} oldest "
                f"keyframes dropped, {stats['num_cells_outside']} cells left out so far",
                throttle_duration_sec=30.0)
        self._dropped_seen = dropped

    def message(self, view: GridView, stamp_ns: int) -> GridMsg:
        """Return ``view`` as a ``nav_msgs/OccupancyGrid`` in :attr:`frame_id`."""
        msg = GridMsg()
        msg.header.frame_id = self.frame_id
        conversions.fill_stamp(msg.header.stamp, stamp_ns)
        conversions.fill_stamp(msg.info.map_load_time, stamp_ns)
        msg.info.resolution = float(view.resolution)
        msg.info.width, msg.info.height = view.width, view.height
        msg.info.origin.position.x = float(view.origin_x)
        msg.info.origin.position.y = float(view.origin_y)
        msg.info.origin.orientation.w = 1.0
        msg.data = view.data.reshape(-1).tobytes()
        return msg

    def save(self, folder: str | Path) -> tuple[Path, Path]:
        """Write the grid as map-server files ``grid.yaml`` + ``grid.pgm`` into ``folder``.

        Raises:
            OSError: the files cannot be written.
        """
        self.grid.update()
        return write_map_server(Path(folder) / GRID_FILE_STEM, self.grid.view())

    def files(self) -> dict[str, bytes]:
        """Return the grid's map-server files by name (``grid.yaml``, ``grid.pgm``), up to date."""
        self.grid.update()
        return map_server_files(GRID_FILE_STEM, self.grid.view())
