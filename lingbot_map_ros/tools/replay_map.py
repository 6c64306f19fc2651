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
"""The point maps of ``lingbot_map_replay run --ply``, one set of files per map segment.

Without loop closure :class:`ReplayMap` is the node's odom-frame ``~/map``: every keyframe's
points in the output axes, fused by a
:class:`~lingbot_map_ros.engine.map.map_accumulator.MapAccumulator`, written as ``map.ply``.

With ``--loop-closure`` ``map.ply`` is in the ``map`` frame, as the node's ``~/map`` then is:
every keyframe also keeps a piece of an
:class:`~lingbot_map_ros.engine.map.anchored_map.AnchoredMap` (its points in its own camera
frame) and, when the segment ends, each piece is placed by its keyframe's final corrected pose
(:meth:`LoopReplay.keyframe_poses <lingbot_map_ros.tools.replay_loop.LoopReplay.keyframe_poses>`),
so a revisited wall is drawn once. The odom-frame map is kept beside it as ``map_odom.ply``
(the same voxel budget again: the before/after of the correction). A segment after a session
reset writes ``map_seg<N>.ply`` (``map_odom_seg<N>.ply``).

With ``--grid`` the keyframes also go into an
:class:`~lingbot_map_ros.engine.map.occupancy_grid.OccupancyGrid` (the node's ``~/grid``), written
as map-server files ``grid.yaml`` + ``grid.pgm`` (``grid_seg<N>``): in ``map`` with loop closure
(the scans placed by the corrected poses, as the pieces), else in the odom frame.
"""

from __future__ import annotations

from pathlib import Path

from lingbot_map_ros.config import GridConfig, MapConfig
from lingbot_map_ros.engine.image.geometry import unproject_depth
from lingbot_map_ros.engine.map.anchored_map import AnchoredMap
from lingbot_map_ros.engine.map.grid_files import write_map_server
from lingbot_map_ros.engine.map.map_accumulator import MapAccumulator
from lingbot_map_ros.engine.map.occupancy_grid import camera_points, OccupancyGrid
from lingbot_map_ros.engine.map.ply import write_ply
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.tools.replay_loop import LoopReplay
import numpy as np
import torch


def ply_name(stem: str, segment: int, suffix: str = '.ply') -> str:
    """Return the file name of a segment's map: ``map.ply``, then ``map_seg<N>.ply``."""
    return f'{stem}{suffix}' if segment == 0 else f'{stem}_seg{segment}{suffix}'


class ReplayMap:
    """The keyframes' map of one replay: odom frame, plus ``map`` frame with loop closure."""

    def __init__(self, config: MapConfig, device: str | torch.device, axes: np.ndarray,
                 loop: LoopReplay | None = None, grid: GridConfig | None = None,
                 save_ply: bool = True) -> None:
        """Start empty maps.

        Args:
            config: the node's ``map.*`` settings.
            device: torch device of the maps.
            axes: [4, 4] output axes from the engine's world (``frames.map_axes``).
            loop: the replay's loop closure, which places the pieces; None: odom map only.
            grid: the ``grid.*`` settings of an occupancy grid to write too; None: none.
            save_ply: write the point maps (``--ply``).
        """
        self._config = config
        self._save_ply = save_ply
        self._grid = OccupancyGrid(grid) if grid is not None else None
        self._axes = np.asarray(axes, np.float64)
        self._odom = MapAccumulator(config, device)
        self._loop = loop
        self._anchored = AnchoredMap(config, device) if loop is not None else None

    @property
    def num_keyframes(self) -> int:
        """Keyframes added to the current segment's map."""
        return self._odom.num_keyframes

    def add(self, pred: FramePrediction) -> None:
        """Add a keyframe with depth (after :meth:`LoopReplay.add` took it, with loop closure).

        Raises:
            RuntimeError: with loop closure, the loop closure has no keyframe for it.
            ValueError: bad depth or pose (as the maps refuse them).
        """
        self._odom.add_points(pred.points(self._axes), pred.depth, pred.depth_conf, pred.image)
        if self._loop is None:
            self._add_to_grid(self._odom.num_keyframes - 1, pred, self._axes @ pred.c2w)
            return
        # The piece is known by the keyframe's number in the loop closure's segment, which is
        # how keyframe_poses lists the corrected poses.
        index = self._loop.num_keyframes - 1
        if index < 0:
            raise RuntimeError('replay map: a keyframe the loop closure did not take')
        points = unproject_depth(pred.depth, pred.intrinsics, np.eye(4), dtype=torch.float32)
        self._anchored.add(index, points, pred.depth, pred.depth_conf, pred.image, None)
        self._add_to_grid(index, pred, None)  # placed by the corrected poses at write()

    def _add_to_grid(self, index: int, pred: FramePrediction, pose: np.ndarray | None) -> None:
        if self._grid is not None:
            self._grid.add(index, camera_points(pred.depth, pred.depth_conf, pred.intrinsics,
                                                self._config), pose)

    def write(self, out_dir: Path, segment: int) -> list[Path]:
        """Write the segment's map files (if it has keyframes) and empty the maps.

        With loop closure, call it before the loop closure ends the segment: the pieces are
        placed by its current (final) keyframe poses.

        Returns:
            The files written.
        """
        if self._odom.num_keyframes == 0:
            return []
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        if self._grid is not None:
            if self._loop is not None:
                poses = self._loop.keyframe_poses()
                self._grid.set_poses(np.arange(len(poses)), self._axes @ poses)
            self._grid.update()
            written += write_map_server(out_dir / ply_name('grid', segment, ''),
                                        self._grid.view())
            self._grid.clear()
        if not self._save_ply:
            self._odom.clear()
            if self._anchored is not None:
                self._anchored.clear()
            return written
        if self._anchored is not None:
            poses = self._loop.keyframe_poses()
            self._anchored.set_poses(np.arange(len(poses)), self._axes @ poses)
            written.append(out_dir / ply_name('map', segment))
            write_ply(written[-1], *self._anchored.points())
            self._anchored.clear()
        written.append(out_dir / ply_name('map' if self._anchored is None else 'map_odom',
                                          segment))
        write_ply(written[-1], *self._odom.points())
        self._odom.clear()
        return written
