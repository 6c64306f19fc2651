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

    metadata.json               format, version, model hash, model identity (preset, embed
                                dim, cache settings), image size, counts, bytes and sha256 of
                                every other file, frame_from_graph (16 numbers, row-major),
                                and its own sha256 (:func:`seal_metadata`)
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
:class:`MapLimits` before a byte of that file is read; the folder holds nothing else (no
unlisted file, no link, no special file). The plausibility bounds of a map's numbers
(:data:`MAX_EXTENT`, :data:`SCALE_RANGE`, :data:`MAX_INFORMATION`) and the bound of every
metadata string (:data:`MAX_TEXT_CHARS`) are the loader's; :func:`shown` bounds every value a
message echoes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import hashlib
import json
import os
from pathlib import Path
import reprlib
import threading
from typing import Any, TYPE_CHECKING

from lingbot_map_ros.engine import metric_scale, sim3
import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    from lingbot_map_ros.config import EngineConfig

FORMAT_NAME = 'lingbot_map_ros.map'
"""The ``format`` value of ``metadata.json``."""
FORMAT_VERSION = 2
"""The version this code writes and the only one it reads (1: before the metadata's own
checksum and the model identity)."""
METADATA = 'metadata.json'
METADATA_SHA256 = 'metadata_sha256'
"""The metadata's key holding the sha256 of the rest of it (:func:`seal_metadata`)."""
IMAGE_FOLDER = 'images'
PLY = 'map.ply'
OPTIONAL_FILES = ('grid.yaml', 'grid.pgm')
"""Files a map may hold beside the required ones (listed and checksummed like them): the
occupancy grid as nav2's map_server reads it, written by ``~/save_map`` when ``~/grid`` runs."""
KIND_CODES = {'odometry': 0, 'loop': 1}
"""Edge kind -> its ``edges_kind.npy`` code."""
KIND_NAMES = {code: name for name, code in KIND_CODES.items()}


MAX_EXTENT = 1e6
"""Largest coordinate of a keyframe, a measured step or a point (metres, or the model's units;
1000 km). The live path's depths end at 1 km (``sensor_depth.MAX_DEPTH_M``)
and its points are float32, whose spacing reaches 6 cm at this distance: a map beyond it is
not one a robot made."""
SCALE_RANGE = metric_scale.SCALE_RANGE
"""Plausible Sim(3) scale of a keyframe pose and of a measured edge: the live path's bound on
a scale (metres per model unit)."""
MAX_INFORMATION = 1e16
"""Largest eigenvalue of an edge's information: a standard deviation of 1e-8 (translation in
pose units, rotation in radians), finer than float64 resolves a pose at :data:`MAX_EXTENT`.
The live path's sigmas are bounded by its parameters' ranges far above it."""
MAX_TEXT_CHARS = 256
"""Longest string the loader accepts in the metadata (a sha256 hash is 71 characters)."""
ECHO_CHARS = 200
"""Longest value a message echoes (:func:`shown`)."""

_REPR = reprlib.Repr()
_REPR.maxstring = ECHO_CHARS
_REPR.maxother = ECHO_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8
_REPR.maxlevel = 3


def shown(value: Any, limit: int = ECHO_CHARS) -> str:
    """Return ``repr(value)`` cut to at most ``limit`` characters, for messages and logs.

    A value read from a file (a 30 MB model hash, a list of a million numbers) may reach a
    service reply, a log line and every diagnostics message: every message that echoes one
    goes through here. Nested containers are abbreviated without walking them whole.
    """
    text = _REPR.repr(value)
    if len(text) > limit:
        text = text[:max(limit - 3, 0)] + '...'
    return text


def seal_metadata(meta: dict[str, Any]) -> bytes:
    """Return the bytes of ``metadata.json``: ``meta`` and the sha256 of the rest of it.

    The hash covers the canonical JSON of ``meta`` without :data:`METADATA_SHA256` (sorted
    keys, one space indent), so any change of a value (a shifted ``frame_from_graph``, another
    image size or model hash) no longer matches; :func:`metadata_checksum_ok` checks it.
    """
    body = {k: v for k, v in meta.items() if k != METADATA_SHA256}
    digest = hashlib.sha256(_canonical(body)).hexdigest()
    return _canonical({**body, METADATA_SHA256: digest})


def metadata_checksum_ok(meta: dict[str, Any]) -> bool:
    """Return True when ``meta``'s :data:`METADATA_SHA256` matches the rest of it."""
    digest = meta.get(METADATA_SHA256)
    body = {k: v for k, v in meta.items() if k != METADATA_SHA256}
    return isinstance(digest, str) and \
        hashlib.sha256(_canonical(body)).hexdigest() == digest


def _canonical(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, indent=1, sort_keys=True, allow_nan=False).encode()


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
class ModelIdentity:
    """What a map's descriptors, images and poses depend on, beyond the weights' hash.

    Recorded by ``save_map`` and compared on load (:meth:`differences`): a map made with
    another preset, embed dim (its descriptors have another length) or cache setting is refused
    at load with the field named, instead of failing every keyframe later.
    """

    preset: str
    """``model.preset``."""
    embed_dim: int
    """``model.embed_dim``: the length of the place descriptors."""
    cache: tuple[tuple[str, Any], ...] = ()
    """``(name, value)`` of the ``cache.*`` settings the poses depend on (:meth:`of`), sorted
    by name."""

    CACHE_FIELDS = ('scale_frames', 'sliding_window', 'dtype')
    """The ``cache.*`` fields :meth:`of` records."""

    @classmethod
    def of(cls, config: EngineConfig) -> ModelIdentity:
        """Return the identity of an engine configuration (``Engine.config``)."""
        return cls(preset=str(config.model.preset), embed_dim=int(config.model.embed_dim),
                   cache=tuple(sorted((name, getattr(config.cache, name))
                                      for name in cls.CACHE_FIELDS)))

    def as_json(self) -> dict[str, Any]:
        """Return the metadata's ``identity`` value."""
        return {'preset': self.preset, 'embed_dim': self.embed_dim,
                'cache': dict(self.cache)}

    @classmethod
    def from_json(cls, value: Any) -> ModelIdentity:
        """Return the identity of a metadata ``identity`` value, every field checked.

        Raises:
            ValueError: a missing field, a wrong type, a string over :data:`MAX_TEXT_CHARS`.
        """
        if not isinstance(value, dict) or set(value) != {'preset', 'embed_dim', 'cache'}:
            raise ValueError(f'identity {shown(value)} needs preset, embed_dim and cache')
        preset, dim, cache = value['preset'], value['embed_dim'], value['cache']
        if not isinstance(preset, str) or not 0 < len(preset) <= MAX_TEXT_CHARS:
            raise ValueError(f'identity: preset {shown(preset)} is not a short string')
        if not isinstance(dim, int) or isinstance(dim, bool) or not 0 < dim <= 1 << 16:
            raise ValueError(f'identity: embed_dim {shown(dim)} is not a size')
        if not isinstance(cache, dict) or len(cache) > 64 or not all(
                isinstance(k, str) and len(k) <= MAX_TEXT_CHARS and (
                    isinstance(v, (int, float, bool)) or
                    (isinstance(v, str) and len(v) <= MAX_TEXT_CHARS))
                for k, v in cache.items()):
            raise ValueError(f'identity: cache {shown(cache)} is not a few short settings')
        return cls(preset=preset, embed_dim=dim, cache=tuple(sorted(cache.items())))

    def differences(self, running: ModelIdentity) -> list[str]:
        """Return what differs from the ``running`` engine's identity, one phrase each."""
        found = []
        if self.preset != running.preset:
            found.append(f'model.preset {shown(self.preset)} (this node: '
                         f'{shown(running.preset)})')
        if self.embed_dim != running.embed_dim:
            found.append(f'model.embed_dim {self.embed_dim} (this node: {running.embed_dim})')
        mine, theirs = dict(self.cache), dict(running.cache)
        for name in sorted(set(mine) | set(theirs)):
            if mine.get(name) != theirs.get(name):
                found.append(f'cache.{name} {shown(mine.get(name))} (this node: '
                             f'{shown(theirs.get(name))})')
        return found


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
    identity: ModelIdentity | None = None
    """The model and cache settings it was made with (a loaded map: what its metadata records;
    None: not recorded)."""
    extra_files: dict[str, bytes] = field(default_factory=dict)
    """Optional files by name (:data:`OPTIONAL_FILES` only), written and checksummed with the
    rest (the occupancy grid's map-server YAML and PGM)."""


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
    identity: ModelIdentity | None = None
    """The running engine's :meth:`ModelIdentity.of` (None: not checked; a map that records
    none is refused when it is given)."""


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
