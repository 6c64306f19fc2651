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
"""Load a map folder (``map_format.py``) only after every check passed.

:func:`load_map` validates before it returns anything, in this order: the metadata (a regular
file within :class:`~lingbot_map_ros.engine.loop.map_format.MapLimits`, format and version),
the model hash and image size against the running engine's, every count and declared size
against the limits, every file (a plain name inside the folder, a regular file and not a link,
its size as declared, its sha256), then the content (array shapes and dtypes from the ``.npy``
headers before the data, finite Sim(3) poses and measurements, positive definite
informations, unit descriptors). Any failure raises
:class:`~lingbot_map_ros.engine.errors.MapLoadError` with the reason. Writing one:
``map_store.save_map``.
"""

from __future__ import annotations

from dataclasses import replace
import hashlib
import io
import json
import os
from pathlib import Path
import re
import stat
from typing import Any

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.errors import MapLoadError
from lingbot_map_ros.engine.loop import map_format as fmt
from lingbot_map_ros.engine.loop.pose_graph import check_edge, PoseGraphEdge
from lingbot_map_ros.engine.map.ply import read_ply
import numpy as np

_ARRAYS = ('stamps_ns', 'poses', 'descriptors', 'edges_ij', 'edges_kind', 'edges_measurement',
           'edges_information', 'image_ids')
_NAME = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)?$')


def load_map(directory: str | Path, expect: fmt.MapExpectation | None = None,
             limits: fmt.MapLimits | None = None) -> fmt.MapSnapshot:
    """Read and validate the map folder ``directory`` (module docstring).

    Args:
        directory: the map folder.
        expect: the running engine's model hash and image size (None: not checked, for tools
            that only inspect a map).
        limits: bounds of the map (default :class:`MapLimits`).

    Returns:
        The map, every check passed.

    Raises:
        MapLoadError: the reason the map is refused.
    """
    limits = limits or fmt.MapLimits()
    folder = Path(directory).expanduser().absolute()
    if not folder.is_dir():
        raise MapLoadError(f'{folder}: not a folder (no map there)')
    meta = _metadata(folder, limits)
    if expect is not None:
        if meta['model_hash'] != expect.model_hash:
            raise MapLoadError(f'{folder}: made with another model ({meta["model_hash"]}; '
                               f'this node runs {expect.model_hash})')
        if expect.image_size_hw is not None and \
                tuple(meta['image_size_hw']) != tuple(expect.image_size_hw):
            raise MapLoadError(f'{folder}: made at image size {meta["image_size_hw"]}; this '
                               f'node processes {list(expect.image_size_hw)}')
    counts = _check_counts(meta, limits)
    data = {name: _read(folder, name, entry, limits)
            for name, entry in _check_files(meta, counts, limits).items()}
    try:
        return _snapshot(folder, meta, counts, data)
    except ValueError as exc:
        raise MapLoadError(f'{folder}: {exc}') from exc


def _metadata(folder: Path, limits: fmt.MapLimits) -> dict[str, Any]:
    raw = _read(folder, fmt.METADATA, None, limits)
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MapLoadError(f'{folder}: {fmt.METADATA} is not JSON ({exc})') from exc
    if not isinstance(meta, dict) or meta.get('format') != fmt.FORMAT_NAME:
        raise MapLoadError(f'{folder}: {fmt.METADATA} is not a {fmt.FORMAT_NAME} file')
    if meta.get('version') != fmt.FORMAT_VERSION:
        raise MapLoadError(f'{folder}: map format version {meta.get("version")!r}; this node '
                           f'reads version {fmt.FORMAT_VERSION}')
    kinds = {'model_hash': str, 'image_size_hw': list, 'intrinsics_source': str,
             'metric': bool, 'created_utc': str, 'counts': dict, 'files': dict,
             'frame_from_graph': list}
    for key, kind in kinds.items():
        if not isinstance(meta.get(key), kind):
            raise MapLoadError(f'{folder}: {fmt.METADATA}: {key!r} missing or not a '
                               f'{kind.__name__}')
    size = meta['image_size_hw']
    if len(size) != 2 or not all(isinstance(v, int) and 0 < v < 1 << 16 for v in size):
        raise MapLoadError(f'{folder}: image_size_hw {size!r} is not two sizes')
    return meta


def _check_counts(meta: dict[str, Any], limits: fmt.MapLimits) -> dict[str, int]:
    bounds = {'keyframes': limits.max_keyframes, 'edges': limits.max_edges,
              'loops': limits.max_edges, 'images': limits.max_keyframes,
              'points': limits.max_points, 'descriptor_dim': limits.max_descriptor_dim}
    counts = meta['counts']
    for key, bound in bounds.items():
        value = counts.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= bound:
            raise MapLoadError(f'count {key!r} = {value!r} is not an integer in 0..{bound}')
    if counts['images'] > counts['keyframes'] or counts['loops'] > counts['edges']:
        raise MapLoadError(f'counts do not add up: {counts}')
    if counts['keyframes'] and counts['descriptor_dim'] < 1:
        raise MapLoadError('descriptor_dim is 0')
    return {key: counts[key] for key in bounds}


def _check_files(meta: dict[str, Any], counts: dict[str, int], limits: fmt.MapLimits
                 ) -> dict[str, dict[str, Any]]:
    files = meta['files']
    needed = {f'{name}.npy' for name in _ARRAYS} | {fmt.PLY}
    missing = sorted(needed - set(files))
    if missing:
        raise MapLoadError(f'{fmt.METADATA} lists no {missing[0]}')
    images = {name for name in files if name.startswith(fmt.IMAGE_FOLDER + '/')}
    if len(images) != counts['images'] or len(files) != len(needed) + len(images):
        raise MapLoadError(f'{fmt.METADATA} lists {len(files)} files: expected the '
                           f'{len(needed)} arrays and PLY and {counts["images"]} images')
    total = 0
    for name, entry in files.items():
        if not isinstance(name, str) or not _NAME.match(name) or '..' in name:
            raise MapLoadError(f'file name {name!r} is not a plain name inside the map')
        size = entry.get('bytes') if isinstance(entry, dict) else None
        digest = entry.get('sha256') if isinstance(entry, dict) else None
        bound = limits.max_image_bytes if name in images else limits.max_file_bytes
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= bound:
            raise MapLoadError(f'{name}: declared size {size!r} bytes is not in 0..{bound}')
        if not isinstance(digest, str) or not re.fullmatch(r'[0-9a-f]{64}', digest):
            raise MapLoadError(f'{name}: no sha256 in {fmt.METADATA}')
        total += size
    if total > limits.max_total_bytes:
        raise MapLoadError(f'declared {total} bytes in all; the limit is '
                           f'{limits.max_total_bytes}')
    return files


def _read(folder: Path, name: str, entry: dict[str, Any] | None, limits: fmt.MapLimits
          ) -> bytes:
    """Return a file's bytes: no link on the way, a regular file, its declared size, sha256."""
    path = folder
    for part in name.split('/'):
        path = path / part
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise MapLoadError(f'{name}: missing ({exc.strerror})') from exc
        if stat.S_ISLNK(st.st_mode):
            raise MapLoadError(f'{name}: {path.name} is a symbolic link (refused)')
    if not stat.S_ISREG(st.st_mode):
        raise MapLoadError(f'{name}: not a regular file')
    bound = limits.max_metadata_bytes if entry is None else int(entry['bytes'])
    if st.st_size > bound or (entry is not None and st.st_size != bound):
        raise MapLoadError(f'{name}: {st.st_size} bytes, '
                           + (f'more than {bound}' if entry is None else
                              f'{fmt.METADATA} says {bound} (truncated or changed)'))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, 'rb') as f:
            data = f.read(bound + 1)
    except OSError as exc:
        raise MapLoadError(f'{name}: cannot read ({exc.strerror})') from exc
    if len(data) != st.st_size:
        raise MapLoadError(f'{name}: changed while read')
    if entry is not None and hashlib.sha256(data).hexdigest() != entry['sha256']:
        raise MapLoadError(f'{name}: sha256 differs from {fmt.METADATA} (corrupt or changed)')
    return data


def _array(data: dict[str, bytes], name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Return a ``.npy``'s array once its header promised the expected shape and dtype."""
    stream = io.BytesIO(data[f'{name}.npy'])
    try:
        version = np.lib.format.read_magic(stream)
        header = (np.lib.format.read_array_header_1_0(stream) if version == (1, 0) else
                  np.lib.format.read_array_header_2_0(stream))
    except (ValueError, OSError) as exc:
        raise ValueError(f'{name}.npy: not an .npy file ({exc})') from exc
    got_shape, fortran, got_dtype = header
    if tuple(got_shape) != shape or np.dtype(got_dtype) != np.dtype(dtype) or fortran:
        raise ValueError(f'{name}.npy: {np.dtype(got_dtype).name} {list(got_shape)}, expected '
                         f'{np.dtype(dtype).name} {list(shape)}')
    stream.seek(0)
    return np.load(stream, allow_pickle=False)


def _snapshot(folder: Path, meta: dict[str, Any], counts: dict[str, int],
              data: dict[str, bytes]) -> fmt.MapSnapshot:
    n, e, d, k = counts['keyframes'], counts['edges'], counts['descriptor_dim'], counts['images']
    stamps = _array(data, 'stamps_ns', (n,), np.int64)
    poses = _array(data, 'poses', (n, 4, 4), np.float64)
    if n:
        sim3.check_poses(poses, 'poses')
    descriptors = _array(data, 'descriptors', (n, d), np.float32)
    norms = np.linalg.norm(descriptors, axis=1) if n else np.ones(0)
    if not (np.isfinite(descriptors).all() and np.allclose(norms, 1.0, atol=1e-3)):
        raise ValueError('descriptors: not finite unit vectors')
    ij = _array(data, 'edges_ij', (e, 2), np.int64)
    kinds = _array(data, 'edges_kind', (e,), np.uint8)
    measurements = _array(data, 'edges_measurement', (e, 4, 4), np.float64)
    informations = _array(data, 'edges_information', (e, 7, 7), np.float64)
    for m in range(e):
        if int(kinds[m]) not in fmt.KIND_NAMES:
            raise ValueError(f'edge {m}: unknown kind code {int(kinds[m])}')
        check_edge(PoseGraphEdge(int(ij[m, 0]), int(ij[m, 1]), measurements[m],
                                 informations[m], fmt.KIND_NAMES[int(kinds[m])]), n, m)
    if int((kinds == fmt.KIND_CODES['loop']).sum()) != counts['loops']:
        raise ValueError('the loop count differs from the edges')
    ids = _array(data, 'image_ids', (k,), np.int64)
    if k and (ids.min() < 0 or ids.max() >= n or (np.diff(ids) <= 0).any()):
        raise ValueError('image_ids: not increasing keyframe numbers')
    images = {}
    for index in ids.tolist():
        jpeg = data.get(fmt.image_name(index))
        if jpeg is None or not jpeg.startswith(b'\xff\xd8'):
            raise ValueError(f'{fmt.image_name(index)}: missing or not a JPEG')
        images[index] = jpeg
    xyz, rgb = _points(folder, counts['points'])
    graph = fmt.KeyframeGraph(stamps_ns=stamps, poses=poses, descriptors=descriptors,
                              edges_ij=ij, edges_kind=kinds, measurements=measurements,
                              informations=informations, images=images)
    return replace(fmt.MapSnapshot(graph=graph, model_hash=meta['model_hash'],
                                   image_size_hw=tuple(meta['image_size_hw'])),
                   intrinsics_source=meta['intrinsics_source'], metric=meta['metric'],
                   points_xyz=xyz, points_rgb=rgb, created_utc=meta['created_utc'],
                   frame_from_graph=_frame(meta['frame_from_graph']))


def _frame(values: list) -> np.ndarray:
    if len(values) != 16 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                    for v in values):
        raise ValueError('frame_from_graph: need 16 numbers')
    return fmt.rigid_frame(np.array(values, np.float64).reshape(4, 4))


def _points(folder: Path, count: int) -> tuple[np.ndarray, np.ndarray]:
    # read_ply takes a path: it reads the file just checked (size, sha256, not a link) again.
    try:
        xyz, rgb = read_ply(folder / fmt.PLY)
    except (OSError, StopIteration, IndexError, ValueError) as exc:
        raise ValueError(f'{fmt.PLY}: not a map PLY ({exc!r})') from exc
    if len(xyz) != count:
        raise ValueError(f'{fmt.PLY}: {len(xyz)} points, metadata says {count}')
    if not np.isfinite(xyz).all():
        raise ValueError(f'{fmt.PLY}: non-finite points')
    return xyz, rgb
