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
"""Where ``~/map``'s keyframe pieces sit in ``map``: odometry, ``map -> odom`` and the graph.

With loop closure ``map_output.MapOutput`` builds ``~/map`` from an
:class:`~lingbot_map_ros.engine.map.anchored_map.AnchoredMap`; :class:`AnchoredPieces` adds each
keyframe's piece (its depth unprojected in its own camera frame) and, on the map's timer, gives
every piece its keyframe's pose from the loop closer after each correction
(``loop_outputs.LoopOutput.corrected_cameras``, matched by the keyframe's stamp).
"""

from __future__ import annotations

import threading
from typing import Any

from lingbot_map_ros.engine.image.geometry import unproject_depth
from lingbot_map_ros.engine.map.anchored_map import AnchoredMap, PieceUpdate
from lingbot_map_ros.engine.session.prediction import FramePrediction
import numpy as np
import torch


class AnchoredPieces:
    """The anchored map and what places its pieces: the keyframes' odometry and the graph.

    Each piece is known by an id (in add order) with its keyframe's stamp and continuous pose
    ``c2w`` (about 300 bytes a keyframe with Python's overhead, forgotten with the piece). A
    piece whose keyframe has a node in the loop closer's graph is placed by that node; one
    without (still queued, or from before the closer restarted) by its ``c2w`` and the latest
    ``map -> odom``.
    """

    def __init__(self, anchored: AnchoredMap, loop_output: Any) -> None:
        self.map = anchored
        self._loop = loop_output
        self._lock = threading.Lock()
        self._keyframes: dict[int, tuple[int, np.ndarray]] = {}
        self.next_id = 0
        self.graph_key: tuple | None = None
        """The loop closer's (identity, version, map state) the pieces were placed by."""

    def add(self, pred: FramePrediction) -> PieceUpdate:
        """Add a keyframe's piece, placed by the current estimate (worker thread).

        Raises:
            ValueError: what ``AnchoredMap.add`` refuses (a malformed pose, bad shapes).
        """
        points = unproject_depth(pred.depth, pred.intrinsics, np.eye(4), dtype=torch.float32)
        c2w = np.asarray(pred.c2w, np.float64)
        # Under the lock that follow_graph holds: a piece is placed either before a
        # correction is applied (and then moved by it) or after it (by the new estimate).
        with self._lock:
            update = self.map.add(self.next_id, points, pred.depth, pred.depth_conf, pred.image,
                                  self._loop.camera_in_map(c2w))
            self._keyframes[self.next_id] = (pred.stamp_ns, c2w)
            self.next_id += 1
        return update

    def follow_graph(self) -> bool:
        """Re-place every piece when the graph changed (timer); returns whether one moved."""
        with self._lock:
            key, stamps, poses = self._loop.corrected_cameras(unless=self.graph_key)
            if key == self.graph_key:
                return False
            kept = self.map.poses()
            for gone in set(self._keyframes) - set(kept):  # dropped by the map's bounds
                del self._keyframes[gone]
            in_graph = dict(zip(stamps.tolist(), poses))
            ids, placed = [], []
            for piece_id, (stamp, c2w) in self._keyframes.items():
                pose = in_graph.get(stamp)
                if pose is None:
                    pose = self._loop.camera_in_map(c2w)
                if pose is not None:
                    ids.append(piece_id)
                    placed.append(pose)
            moved = self.map.set_poses(ids, np.reshape(placed, (len(ids), 4, 4)))
            self.graph_key = key
        return moved > 0

    def clear(self) -> int:
        """Forget every piece (session reset); returns the map points removed."""
        removed = self.map.clear()
        with self._lock:
            self._keyframes.clear()
            self.next_id = 0
            self.graph_key = None
        return removed
