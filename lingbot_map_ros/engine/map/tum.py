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
"""Camera trajectories as TUM files: the node's ``~/save`` and the tools write and read them.

TUM format: one pose per line, ``timestamp tx ty tz qx qy qz qw``, timestamp in seconds, the pose
that of the camera optical frame (x right, y down, z forward) in the map frame (``c2w``); lines
starting with ``#`` are comments. Timestamps are written with 9 decimals and read back to the
exact nanosecond, so stamps survive a round trip. Comparing, plotting and evaluating
trajectories is the tools' (``tools/trajectory.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lingbot_map_ros.engine.image.geometry import quaternion_to_rotation, rotation_to_quaternion
import numpy as np


@dataclass(frozen=True)
class Trajectory:
    """Stamped camera poses."""

    stamps_ns: np.ndarray
    """[N] int64 stamps, nanoseconds."""
    c2w: np.ndarray
    """[N, 4, 4] float64 camera optical frame in the world frame."""

    @property
    def positions(self) -> np.ndarray:
        """[N, 3] camera centres in the world frame."""
        return self.c2w[:, :3, 3]


def format_stamp(stamp_ns: int) -> str:
    """Integer nanoseconds -> seconds with 9 decimals, exact (``-4900000000`` -> ``-4.900000000``).

    The sign is written once, in front: a negative stamp is not floored to the second below.
    """
    sec, nsec = divmod(abs(int(stamp_ns)), 1_000_000_000)
    return f'{"-" if stamp_ns < 0 else ""}{sec}.{nsec:09d}'


def _parse_stamp(text: str) -> int:
    """Seconds as text -> exact integer nanoseconds (no float rounding for <= 9 decimals)."""
    if 'e' in text.lower():
        return int(round(float(text) * 1e9))
    whole, _, frac = text.partition('.')
    sign = -1 if whole.startswith('-') else 1
    return int(whole) * 1_000_000_000 + sign * int((frac + '000000000')[:9])


def write_tum(path: str | Path, trajectory: Trajectory, comments: Iterable[str] = ()) -> None:
    """Write a TUM trajectory file.

    Args:
        path: output file (its folder is created).
        trajectory: poses to write, in order.
        comments: lines written first, each prefixed with ``# `` (line breaks inside one are
            written as spaces, so a comment never becomes a pose line).

    Raises:
        ValueError: a pose with non-finite values (nothing is written).
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# {' '.join(str(c).splitlines())}" for c in comments]
    lines.append('# timestamp tx ty tz qx qy qz qw')
    c2w = np.asarray(trajectory.c2w, dtype=np.float64).reshape(-1, 4, 4)
    bad = np.flatnonzero(~np.isfinite(c2w).all(axis=(1, 2)))
    if bad.size:
        raise ValueError(f'write_tum: pose {bad[0]} has non-finite values')
    # The position and (x, y, z, w) quaternion with w >= 0 that ~/pose carries.
    quats = rotation_to_quaternion(c2w[:, :3, :3])
    for stamp, pose, quat in zip(trajectory.stamps_ns, c2w, quats):
        values = ' '.join(f'{float(v):.9g}' for v in (*pose[:3, 3], *quat))
        lines.append(f'{format_stamp(stamp)} {values}')
    out.write_text('\n'.join(lines) + '\n', encoding='utf-8')


def read_tum(path: str | Path) -> Trajectory:
    """Read a TUM trajectory file.

    Args:
        path: file with ``timestamp tx ty tz qx qy qz qw`` lines (``#`` comments allowed).

    Returns:
        The trajectory, in file order.

    Raises:
        ValueError: a line that does not hold 8 numbers (its line number is named).
    """
    stamps, poses = [], []
    for number, line in enumerate(Path(path).read_text(encoding='utf-8').splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        fields = line.replace(',', ' ').split()
        if len(fields) != 8:
            raise ValueError(f'{path}:{number}: expected 8 values, got {len(fields)}')
        values = np.array([float(v) for v in fields[1:]])
        c2w = np.eye(4)
        c2w[:3, :3] = quaternion_to_rotation(values[3:])
        c2w[:3, 3] = values[:3]
        stamps.append(_parse_stamp(fields[0]))
        poses.append(c2w)
    return Trajectory(np.array(stamps, dtype=np.int64), np.array(poses).reshape(-1, 4, 4))
