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
"""The ground-truth map of the synthetic scene lies on the room's surfaces; its PNG is drawn.

Run: ``pytest test/tools/test_map_plot.py`` (a few seconds, CPU).
"""

from lingbot_map_ros.config import MapConfig
from lingbot_map_ros.ros.messages.conversions import map_axes_transform
from lingbot_map_ros.tools import synthetic_scene
from lingbot_map_ros.tools.map_plot import ground_truth_map, plot_map
from lingbot_map_ros.tools.synthetic_scene import camera_path, render_sequence, SceneConfig
import numpy as np

VOXEL = 0.05


def _distance_to_surfaces(p):
    """Distance of room-frame points to the nearest wall, floor, ceiling or box face."""
    lo, hi = synthetic_scene.ROOM
    best = np.min(np.abs(np.concatenate([p - lo, hi - p], axis=1)), axis=1)
    for blo, bhi in synthetic_scene.BOXES:
        outside = np.linalg.norm(np.maximum(np.maximum(blo - p, p - bhi), 0.0), axis=1)
        inside = np.min(np.concatenate([p - blo, bhi - p], axis=1), axis=1)
        best = np.minimum(best, np.where(outside > 0, outside, np.abs(inside)))
    return best


def test_ground_truth_map_lies_on_the_scene_and_is_drawn(tmp_path):
    scene = SceneConfig(width=96, height=54, num_frames=6)
    seq = render_sequence(scene)
    acc = ground_truth_map(seq, MapConfig(voxel_size=VOXEL, pixel_stride=1), 'flu')
    xyz, rgb = acc.points()
    assert acc.num_keyframes == 6 and 1000 < len(xyz) < 6 * 96 * 54
    # Back to the room frame: map (flu) -> first camera -> room.
    room_from_map = camera_path(scene.num_frames)[0] @ np.linalg.inv(map_axes_transform('flu'))
    room = xyz.astype(np.float64) @ room_from_map[:3, :3].T + room_from_map[:3, 3]
    # A voxel's point is the mean of surface points: on the surface, or inside an edge's voxel.
    distance = _distance_to_surfaces(room)
    assert np.median(distance) < 0.01 and np.quantile(distance, 0.99) < VOXEL
    assert rgb.std() > 10  # the textures' colours, not white
    png = tmp_path / 'map.png'
    plot_map(png, xyz, rgb, (map_axes_transform('flu') @ seq.c2w)[:, :3, 3], title='t')
    data = png.read_bytes()
    assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 20_000
