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
"""The place oracle in a room: depth of a box's walls, an odometry whose heading drifts.

:class:`WallOracle` answers with :func:`heading_drift` of the true route and gives each frame
the depth of the room (a box, :data:`ROOM`) seen from its *true* pose, so a map built from the
odometry shows a revisited wall twice and one built from corrected poses shows it once.
:func:`wall_distance` measures how far points are from the walls. Used by the node and replay
tests of the map with loop closure.
"""

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.image import geometry
from loop_scenes import Places, rotation
import numpy as np
from place_oracle import PlaceOracle
import torch

ROOM = np.array([5.0, 3.0, 7.0])
"""Half extents of the box room around the route (radius 3), in ground-truth units."""


def heading_drift(truth: np.ndarray) -> np.ndarray:
    """Return the route as an odometry whose heading drifts 0.5 degrees a frame."""
    out = [truth[0]]
    for k in range(1, len(truth)):
        step = sim3.inverse(truth[k - 1]) @ truth[k]
        out.append(out[-1] @ step @ sim3.make(rotation([0, 1, 0], np.radians(0.5)),
                                              np.zeros(3)))
    return np.stack(out)


class WallOracle(PlaceOracle):
    """The place oracle whose depth is the room seen from each keyframe's true pose."""

    def __init__(self, truth: np.ndarray, config, places: Places) -> None:
        """Answer with the drifting odometry of ``truth``, and depth from ``truth`` itself."""
        super().__init__(heading_drift(truth), config, places)
        self.truth = truth

    def _outputs(self, images: torch.Tensor, with_depth: bool) -> dict:
        out = super()._outputs(images, False)
        if with_depth:
            scale = self._session_frame()[0]
            height, width = images.shape[-2:]
            k = geometry.pose_encoding_to_intrinsics(out['pose_enc'][0].numpy(),
                                                     (height, width))
            maps = [scale * room_depth(self.truth[self._index(image)], np.asarray(k),
                                       (height, width)) for image in images]
            out['depth'] = torch.tensor(np.stack(maps), dtype=torch.float32)
            out['depth_conf'] = torch.ones_like(out['depth'])
        return out


def room_depth(pose: np.ndarray, k: np.ndarray, size_hw: tuple[int, int]) -> np.ndarray:
    """z-depth of the room's walls seen by a camera at ``pose`` (inside the room)."""
    v, u = np.mgrid[0:size_hw[0], 0:size_hw[1]]
    rays = np.stack([(u - k[0, 2]) / k[0, 0], (v - k[1, 2]) / k[1, 1], np.ones(u.shape)], -1)
    d = rays @ pose[:3, :3].T
    with np.errstate(divide='ignore', invalid='ignore'):
        t = (np.sign(d) * ROOM - pose[:3, 3]) / d  # per axis: where the ray meets that wall
    return np.where(np.isfinite(t) & (t > 0), t, np.inf).min(-1)  # ray z is 1: t is depth


def wall_distance(xyz: np.ndarray, frame_from_truth: np.ndarray) -> np.ndarray:
    """Distance of points in a frame from the true walls, in that frame's units.

    ``frame_from_truth`` is the Sim(3) from ground truth into the points' frame.
    """
    scale = float(np.cbrt(np.linalg.det(frame_from_truth[:3, :3])))
    truth = (xyz - frame_from_truth[:3, 3]) @ frame_from_truth[:3, :3] / scale ** 2
    return np.abs(np.abs(truth) - ROOM).min(axis=1) * scale
