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
"""What ``~/save`` writes: a new timestamped folder with the trajectory, the map and the camera.

``<output.directory>/<YYYYmmdd-HHMMSS>/`` (``-2``, ``-3`` ... appended when two saves share a
second) holds:

- ``trajectory.tum``: every pose published on ``~/pose`` since the map was last cleared,
  ``timestamp tx ty tz qx qy qz qw`` (``base_frame`` in ``odom_frame``, the same position and
  quaternion as the messages);
- ``map.ply``: the current map (binary PLY, x y z + rgb; empty when no keyframe was added);
- ``camera_info.yaml``: the intrinsics estimated for the latest frame, for the *input* image
  size, in the ``camera_calibration`` / ``camera_info_manager`` format (pinhole, no distortion),
  and ``camera_info_processed.yaml`` for the processed (depth) image size.

A failure removes the half-written folder and raises ``OSError``; the node answers it with
``success=False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
import shutil
from typing import Any

from lingbot_map_ros.engine.map import tum
from lingbot_map_ros.engine.map.ply import write_ply
from lingbot_map_ros.ros.parameters.save_directory import resolve_directory
import numpy as np
import yaml


@dataclass(frozen=True)
class CameraEstimate:
    """The intrinsics of one frame, as the engine estimated them."""

    frame_id: str
    stamp_ns: int
    k: np.ndarray
    """[3, 3] for the input image."""
    size_hw: tuple[int, int]
    k_processed: np.ndarray
    """[3, 3] for the processed image (the depth image)."""
    processed_size_hw: tuple[int, int]


@dataclass(frozen=True)
class SaveSnapshot:
    """Everything one save writes."""

    stamps_ns: np.ndarray
    """[N] int64."""
    c2w: np.ndarray
    """[N, 4, 4] ``base_frame`` poses in ``odom_frame``."""
    xyz: np.ndarray
    """[M, 3] map points."""
    rgb: np.ndarray
    """[M, 3] uint8 colours."""
    camera: CameraEstimate | None
    comments: tuple[str, ...] = ()
    """Header lines of the TUM file."""


def save(directory: str, snapshot: SaveSnapshot, now: datetime | None = None) -> Path:
    """Write a snapshot into a new folder under ``directory``.

    Args:
        directory: parent folder (:func:`resolve_directory`; created when missing).
        snapshot: what to write.
        now: time that names the folder (default: now, UTC).

    Returns:
        The new folder, an absolute path.

    Raises:
        ValueError: ``directory`` does not resolve (:func:`resolve_directory`).
        OSError: the folder or a file cannot be written (the folder is removed again).
    """
    parent = resolve_directory(directory)
    name = (now or datetime.now(timezone.utc)).strftime('%Y%m%d-%H%M%S')
    parent.mkdir(parents=True, exist_ok=True)
    folder = parent / name
    for attempt in range(2, 1000):
        try:
            folder.mkdir()
            break
        except FileExistsError:
            folder = parent / f'{name}-{attempt}'
    else:
        raise OSError(f'no free folder name for {parent / name}')
    try:
        write_tum(folder / 'trajectory.tum', snapshot.stamps_ns, snapshot.c2w, snapshot.comments)
        write_ply(folder / 'map.ply', snapshot.xyz, snapshot.rgb)
        if snapshot.camera is not None:
            cam = snapshot.camera
            write_camera_info(folder / 'camera_info.yaml', cam.k, cam.size_hw, cam)
            write_camera_info(folder / 'camera_info_processed.yaml', cam.k_processed,
                              cam.processed_size_hw, cam)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def write_tum(path: Path, stamps_ns: np.ndarray, c2w: np.ndarray,
              comments: tuple[str, ...] = ()) -> None:
    """Write poses as TUM lines, with the position and quaternion that ``~/pose`` carries."""
    tum.write_tum(path, tum.Trajectory(np.asarray(stamps_ns, np.int64),
                                       np.asarray(c2w, np.float64)), comments)


def write_camera_info(path: Path, k: np.ndarray, size_hw: tuple[int, int],
                      camera: CameraEstimate) -> None:
    """Write a pinhole camera in the ``camera_calibration`` YAML format.

    Written by ``yaml.safe_dump``: any ``frame_id`` (a colon, a newline, quotes) is quoted as a
    string, so the file always parses back with the name it was given.
    """
    def matrix(rows: int, cols: int, values: np.ndarray) -> dict[str, Any]:
        data = [float(v) for v in np.asarray(values, np.float64).reshape(-1)]
        return {'rows': rows, 'cols': cols, 'data': data}

    k = np.asarray(k, np.float64)
    info = {'image_width': int(size_hw[1]), 'image_height': int(size_hw[0]),
            'camera_name': camera.frame_id or 'camera',
            'camera_matrix': matrix(3, 3, k),
            'distortion_model': 'plumb_bob',
            'distortion_coefficients': matrix(1, 5, np.zeros(5)),
            'rectification_matrix': matrix(3, 3, np.eye(3)),
            'projection_matrix': matrix(3, 4, np.hstack([k, np.zeros((3, 1))]))}
    header = (f'# estimated by lingbot_map for the frame at stamp {int(camera.stamp_ns)} ns '
              '(pinhole, principal point at the centre, no distortion)\n')
    text = yaml.safe_dump(info, sort_keys=False, default_flow_style=None, allow_unicode=True)
    path.write_text(header + text, encoding='utf-8')
