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
"""Coloured point clouds as binary PLY files (MeshLab, CloudCompare, Open3D, PCL read them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_ply(path: str | Path, xyz: np.ndarray, rgb: np.ndarray | None = None) -> None:
    """Write a binary little-endian PLY of coloured points (an empty cloud is a valid file).

    Args:
        path: output file (its folder must exist).
        xyz: [N, 3] positions.
        rgb: [N, 3] colours 0-255, or None for white.

    Raises:
        ValueError: shapes that do not match.
        OSError: the file cannot be written.
    """
    xyz = np.asarray(xyz).reshape(-1, 3)
    rgb = np.full(xyz.shape, 255, np.uint8) if rgb is None else np.asarray(rgb).reshape(-1, 3)
    if len(rgb) != len(xyz):
        raise ValueError(f'write_ply: {len(xyz)} points but {len(rgb)} colours')
    record = np.empty(len(xyz), dtype=[('x', '<f4'), ('y', '<f4'), ('z', '<f4'),
                                       ('red', 'u1'), ('green', 'u1'), ('blue', 'u1')])
    for i, name in enumerate(('x', 'y', 'z')):
        record[name] = xyz[:, i]
    for i, name in enumerate(('red', 'green', 'blue')):
        record[name] = np.clip(np.rint(rgb[:, i]), 0, 255)
    header = ('ply\nformat binary_little_endian 1.0\n'
              f'element vertex {len(xyz)}\n'
              'property float x\nproperty float y\nproperty float z\n'
              'property uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n')
    with open(path, 'wb') as f:
        f.write(header.encode('ascii'))
        f.write(record.tobytes())


def read_ply(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read a PLY written by :func:`write_ply`: ``([N, 3] float32 xyz, [N, 3] uint8 rgb)``.

    Raises:
        ValueError: not a file of that layout.
    """
    data = Path(path).read_bytes()
    header, sep, body = data.partition(b'end_header\n')
    lines = header.decode('ascii', errors='replace').splitlines()
    if not sep or lines[:2] != ['ply', 'format binary_little_endian 1.0']:
        raise ValueError(f'{path}: not a binary little-endian PLY')
    count = int(next(line.split()[2] for line in lines if line.startswith('element vertex')))
    record = np.frombuffer(body, dtype=[('x', '<f4'), ('y', '<f4'), ('z', '<f4'),
                                        ('red', 'u1'), ('green', 'u1'), ('blue', 'u1')],
                           count=count)
    xyz = np.stack([record['x'], record['y'], record['z']], axis=1)
    rgb = np.stack([record['red'], record['green'], record['blue']], axis=1)
    return xyz, rgb
