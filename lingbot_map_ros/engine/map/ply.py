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


_RECORD = np.dtype([('x', '<f4'), ('y', '<f4'), ('z', '<f4'),
                    ('red', 'u1'), ('green', 'u1'), ('blue', 'u1')])
_HEADER_LINES = ('ply', 'format binary_little_endian 1.0', None, 'property float x',
                 'property float y', 'property float z', 'property uchar red',
                 'property uchar green', 'property uchar blue', 'end_header')
"""The header :func:`write_ply` writes, line by line (None: ``element vertex N``)."""
_MAX_HEADER_BYTES = 4096


def read_ply(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read a PLY written by :func:`write_ply`: ``([N, 3] float32 xyz, [N, 3] uint8 rgb)``.

    Raises:
        ValueError: not a file of that layout (:func:`parse_ply`).
        OSError: the file cannot be read.
    """
    try:
        return parse_ply(Path(path).read_bytes())
    except ValueError as exc:
        raise ValueError(f'{path}: {exc}') from exc


def parse_ply(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Parse the bytes of a PLY written by :func:`write_ply` (the map loader's bytes, checked).

    Only that layout is accepted: the exact header, then exactly N records of 15 bytes (no
    byte more or less), so the cost is bounded by ``len(data)``.

    Returns:
        ``([N, 3] float32 xyz, [N, 3] uint8 rgb)``, copies of the data.

    Raises:
        ValueError: another header, a vertex count that is not a number, a body whose length
            is not N records.
    """
    end = data.find(b'end_header\n', 0, _MAX_HEADER_BYTES)
    if end < 0:
        raise ValueError('not a binary little-endian PLY (no end_header in the first '
                         f'{_MAX_HEADER_BYTES} bytes)')
    split = end + len(b'end_header\n')
    lines = data[:split].decode('ascii', errors='replace').split('\n')[:-1]
    count = -1
    if len(lines) == len(_HEADER_LINES):
        words = lines[2].split(' ')
        if len(words) == 3 and words[:2] == ['element', 'vertex'] and words[2].isdigit():
            count = int(words[2])
    if count < 0 or any(want is not None and line != want
                        for line, want in zip(lines, _HEADER_LINES)):
        raise ValueError('not the binary little-endian x y z red green blue PLY layout')
    body = len(data) - split
    if body != count * _RECORD.itemsize:
        raise ValueError(f'{count} vertices need {count * _RECORD.itemsize} bytes after the '
                         f'header, the file has {body}')
    record = np.frombuffer(data, dtype=_RECORD, count=count, offset=split)
    xyz = np.stack([record['x'], record['y'], record['z']], axis=1)
    rgb = np.stack([record['red'], record['green'], record['blue']], axis=1)
    return xyz, rgb
