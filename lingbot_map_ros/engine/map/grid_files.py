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
"""The occupancy grid as map-server files: a YAML and a PGM image that nav2's map_server loads.

The YAML holds ``image`` (the PGM's name, beside it), ``resolution``, ``origin`` (x, y, yaw of
the lower-left pixel), ``negate: 0``, ``occupied_thresh``, ``free_thresh`` and ``mode:
trinary``. The PGM is binary 8-bit (P5), its first row the grid's highest y. Under map_server's
trinary rules (``negate: 0``) a pixel ``v`` has occupancy ``(255 - v) / 255``: occupied above
``occupied_thresh``, free below ``free_thresh``, unknown between. So cells are written as
:data:`PIXEL_OCCUPIED`, :data:`PIXEL_FREE` and :data:`PIXEL_UNKNOWN`, far from both thresholds.
Used by ``~/save`` (``ros/publishers/map_save.py``) and ``lingbot_map_replay run --grid``.
"""

from __future__ import annotations

import os
from pathlib import Path

from lingbot_map_ros.engine.map.grid_cells import FREE, GridView, OCCUPIED
import numpy as np
import yaml

PIXEL_OCCUPIED, PIXEL_FREE, PIXEL_UNKNOWN = 0, 254, 205
"""Pixel values of the three cell states (map_server's own choice for saved maps)."""
OCCUPIED_THRESH, FREE_THRESH = 0.65, 0.196
"""Thresholds written into the YAML: 0 reads as occupied, 254 as free, 205 as unknown."""


def grid_pixels(view: GridView) -> np.ndarray:
    """Return the PGM image of a grid: [H, W] uint8, first row the highest y."""
    pixels = np.full(view.data.shape, PIXEL_UNKNOWN, np.uint8)
    pixels[view.data == OCCUPIED] = PIXEL_OCCUPIED
    pixels[view.data == FREE] = PIXEL_FREE
    return pixels[::-1]


def write_map_server(stem: str | os.PathLike, view: GridView) -> tuple[Path, Path]:
    """Write ``<stem>.yaml`` and ``<stem>.pgm`` (map_server format, trinary).

    Args:
        stem: path without suffix; its folder must exist.
        view: the grid (:meth:`OccupancyGrid.view`).

    Returns:
        (the YAML's path, the PGM's path).

    Raises:
        OSError: the files cannot be written.
    """
    stem = Path(stem)
    paths = []
    for name, data in map_server_files(stem.name, view).items():
        path = stem.with_name(name)
        path.write_bytes(data)
        paths.append(path)
    return paths[0], paths[1]


def map_server_files(stem: str, view: GridView) -> dict[str, bytes]:
    """Return the map-server files of a grid by name: ``<stem>.yaml`` first, then ``<stem>.pgm``.

    The bytes :func:`write_map_server` writes; a saved keyframe map holds them too.
    """
    pixels = grid_pixels(view)
    header = f'P5\n# lingbot_map ~/grid\n{view.width} {view.height}\n255\n'.encode('ascii')
    meta = yaml.safe_dump({
        'image': f'{stem}.pgm', 'mode': 'trinary', 'resolution': float(view.resolution),
        'origin': [float(view.origin_x), float(view.origin_y), 0.0], 'negate': 0,
        'occupied_thresh': OCCUPIED_THRESH, 'free_thresh': FREE_THRESH}, sort_keys=False)
    return {f'{stem}.yaml': meta.encode('utf-8'), f'{stem}.pgm': header + pixels.tobytes()}
