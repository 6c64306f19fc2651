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
"""What a saved map holds, the limits a loaded one must respect, and the model's identity.

A map is one folder (format version :data:`FORMAT_VERSION`; written by ``map_store.py``, read
by ``map_load.py``). N keyframes, E graph edges, D descriptor floats, K stored images, M
points::

    metadata.json               format, version, model hash, image size, counts, sha256 per
                                file, frame_from_graph (16 numbers, row-major)
    stamps_ns.npy               int64   [N]        each keyframe's image stamp
    poses.npy                   float64 [N, 4, 4]  map-from-camera Sim(3) (top-left s * R)
    descriptors.npy             float32 [N, D]     place descriptors, L2-normalised
    edges_ij.npy                int64   [E, 2]     from, to node
    edges_kind.npy              uint8   [E]        0 odometry, 1 loop
    edges_measurement.npy       float64 [E, 4, 4]  Sim(3) ~ inv(T_i) @ T_j
    edges_information.npy       float64 [E, 7, 7]  translation, rotation, log-scale
    image_ids.npy               int64   [K]        keyframes whose JPEG is stored, increasing
    images/<id:06d>.jpg         the processed keyframe image, JPEG (for verification)
    map.ply                     the point map in ``map`` (binary PLY, x y z + rgb)

Arrays are ``.npy`` files written without pickle and read with ``allow_pickle=False``; the
metadata is JSON. Every count and every declared file size is checked against
:class:`MapLimits` before a byte of that file is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import hashlib
import os
from pathlib import Path
import threading

from lingbot_map_ros.engine import sim3
import numpy as np

FORMAT_NAME = 'lingbot_map_ros.map'
"""The ``format`` value of ``metadata.json``."""
FORMAT_VERSION = 1
"""The version this code writes and the only one it reads."""
METADATA = 'metadata.json'
IMAGE_FOLDER = 'images'
PLY = 'map.ply'
KIND_CODES = {'odometry': 0, 'loop': 1}
"""Edge kind -> its ``edges_kind.npy`` code."""
KIND_NAMES = {code: name for name, code in KIND_CODES.items()}


def image_name(index: int) -> str:
    """Relative file name of keyframe ``index``'s JPEG."""
    return f'{IMAGE_FOLDER}/{index:06d}.jpg'


@dataclass(frozen=True)
class KeyframeGraph:
    """The loop closer's keyframes and pose graph, as saved and as seeded (all on the host)."""

    stamps_ns: np.ndarray
    """int64 [N] each keyframe's image stamp."""
    poses: np.ndarray
    """float64 [N, 4, 4] map-from-camera Sim(3) of each keyframe (the graph's estimate)."""
    descriptors: np.ndarray
    """float32 [N, D] L2-normalised place descriptors."""
    edges_ij: np.ndarray
    """int64 [E, 2] from and to node of each edge."""
    edges_kind: np.ndarray
    """uint8 [E] :data:`KIND_CODES`."""
    measurements: np.ndarray
    """float64 [E, 4, 4] Sim(3) ~ inv(T_i) @ T_j."""
    informations: np.ndarray
    """float64 [E, 7, 7] (translation, rotation, log-scale)."""
    images: dict[int, bytes] = field(default_factory=dict)
    """JPEG of keyframe n, for the keyframes whose image is still stored."""

    @property
    def num_keyframes(self) -> int:
        """N."""
        return int(len(self.poses))

    def check(self) -> None:
        """Check that the arrays agree with one another (shapes, dtypes, node numbers).

        Raises:
            ValueError: naming the first array that does not fit.
        """
        n, e = len(self.poses), len(self.edges_ij)
        expected = {'stamps_ns': ((n,), np.int64), 'poses': ((n, 4, 4), np.float64),
                    'edges_ij': ((e, 2), np.int64), 'edges_kind': ((e,), np.uint8),
                    'measurements': ((e, 4, 4), np.float64),
                    'informations': ((e, 7, 7), np.float64)}
        for name, (shape, dtype) in expected.items():
            arr = getattr(self, name)
            if arr.shape != shape or arr.dtype != dtype:
                raise ValueError(f'{name}: need {np.dtype(dtype).name} {list(shape)}, got '
                                 f'{arr.dtype.name} {list(arr.shape)}')
        d = self.descriptors
        if d.dtype != np.float32 or d.ndim != 2 or len(d) != n or (n and d.shape[1] < 1):
            raise ValueError(f'descriptors: need float32 [{n}, D], got {d.dtype.name} '
                             f'{list(d.shape)}')
        if e and (self.edges_ij.min() < 0 or self.edges_ij.max() >= n):
            raise ValueError(f'edges_ij: a node outside 0..{n - 1}')
        unknown = set(np.unique(self.edges_kind).tolist()) - set(KIND_NAMES)
        if unknown:
            raise ValueError(f'edges_kind: unknown codes {sorted(unknown)}')
        bad = [k for k in self.images if not (isinstance(k, int) and 0 <= k < n)]
        if bad:
            raise ValueError(f'images: keyframes {bad[:5]} outside 0..{n - 1}')


@dataclass(frozen=True)
class MapSnapshot:
    """One saved map: the keyframe graph, the point map and what it was made with."""

    graph: KeyframeGraph
    """Keyframes, descriptors, pose graph, images."""
    model_hash: str
    """The model's identity (:func:`model_hash`): descriptors and verification need it."""
    image_size_hw: tuple[int, int]
    """Processed image size (height, width) the keyframes and descriptors were made at."""
    intrinsics_source: str = 'model'
    """Where the intrinsics came from ('model': estimated per frame, 'camera_info', ...)."""
    metric: bool = False
    """Poses in metres (a depth camera locked the scale); False: the model's own units."""
    points_xyz: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.float32))
    """float32 [M, 3] point map in ``map``."""
    points_rgb: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.uint8))
    """uint8 [M, 3] colours."""
    created_utc: str = ''
    """ISO 8601 creation time (set by the save)."""
    frame_from_graph: np.ndarray = field(default_factory=lambda: np.eye(4))
    """float64 [4, 4] rigid: the frame the map is published in (the node's ``map``) from the
    graph's frame; the node keeps it so that a loaded map is published where it was made."""


def rigid_frame(matrix: np.ndarray) -> np.ndarray:
    """Return ``matrix`` as float64 [4, 4] once it is a finite rigid transform.

    Raises:
        ValueError: another shape, non-finite values, a scale or shear, a bad bottom row.
    """
    arr = np.asarray(matrix, dtype=np.float64)
    if arr.shape != (4, 4):
        raise ValueError(f'frame_from_graph must be [4, 4], got {list(arr.shape)}')
    sim3.check_poses(arr[None], 'frame_from_graph')
    if abs(float(sim3.scale_of(arr)) - 1.0) > 1e-6:
        raise ValueError('frame_from_graph must be rigid (scale 1)')
    return arr


@dataclass(frozen=True)
class MapExpectation:
    """What a loaded map must match: the running engine's model and image size."""

    model_hash: str
    image_size_hw: tuple[int, int] | None
    """None before the engine's first frame (the caller checks it later)."""


@dataclass(frozen=True)
class MapLimits:
    """Bounds of a loaded map, checked against the metadata before any file is read."""

    max_keyframes: int = 200_000
    max_edges: int = 2_000_000
    max_descriptor_dim: int = 8192
    max_points: int = 100_000_000
    max_image_bytes: int = 16 * 2**20
    """One keyframe JPEG."""
    max_file_bytes: int = 4 * 2**30
    """Any one file."""
    max_total_bytes: int = 8 * 2**30
    """All the files together."""
    max_metadata_bytes: int = 64 * 2**20


_HASHES: dict[tuple[str, int, int], str] = {}
_HASH_LOCK = threading.Lock()


def model_hash(weights: str) -> str:
    """Return the identity of the weights a map is made with (``Engine.weights``).

    A checkpoint file is identified by the sha256 of its bytes (computed once per file,
    size and modification time; about 10 s for the official 4.6 GB checkpoint); random
    weights by their description (``random (seed N)``), so two random-weight engines with
    one seed share maps and with another do not.

    Args:
        weights: a checkpoint path, or the engine's description of random weights.

    Returns:
        ``'sha256:<hex>'`` or ``'random:<description>'``.
    """
    path = Path(weights)
    if not path.is_file():
        return f'random:{weights}'
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _HASH_LOCK:
        if key not in _HASHES:
            digest = hashlib.sha256()
            with open(path, 'rb') as f:
                for chunk in iter(lambda: f.read(1 << 22), b''):
                    digest.update(chunk)
            _HASHES[key] = 'sha256:' + digest.hexdigest()
        return _HASHES[key]


def fsync_folder(folder: Path) -> None:
    """Make a folder's entries (new files, renames) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
