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

:func:`load_map` validates before it returns anything, in this order:

1. the metadata: a regular file (no link, no special file) within
   :class:`~lingbot_map_ros.engine.mapping.store.map_format.MapLimits`, JSON, format and version,
   its own sha256 (``map_format.seal_metadata``), every field's type, every string within
   ``MAX_TEXT_CHARS``;
2. the model hash, the model identity (preset, embed dim, cache settings) and the image size
   against the running engine's;
3. every count and declared size against the limits, the descriptor length against the
   recorded embed dim;
4. the folder: nothing in it but the listed files (no unlisted file, no link, no special file);
5. every file, read once through the folder's descriptor (a path swapped meanwhile is never
   followed): a regular file of its declared size, never read past it, its sha256;
6. the content, from those bytes: each ``.npy`` exactly its header and shape x item size
   (no trailing byte), the PLY parsed from its checked bytes; finite Sim(3) poses and
   measurements within the plausibility bounds (``MAX_EXTENT``, ``SCALE_RANGE``), symmetric
   positive definite informations up to ``MAX_INFORMATION``, unit descriptors; a usable graph
   (at least one keyframe and one edge, every keyframe connected to the first).

Any failure raises :class:`~lingbot_map_ros.engine.errors.MapLoadError` with the reason, every
echoed value bounded (``map_format.shown``). Writing one: ``map_store.save_map``.
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
from lingbot_map_ros.engine.map.ply import parse_ply
from lingbot_map_ros.engine.mapping.store import map_format as fmt
import numpy as np

_ARRAYS = ('stamps_ns', 'poses', 'descriptors', 'edges_ij', 'edges_kind', 'edges_measurement',
           'edges_information', 'image_ids')
_NAME = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)?$')
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO must not block the open
_OPEN_FOLDER = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY
_TEXTS = ('model_hash', 'intrinsics_source', 'created_utc')


def load_map(directory: str | Path, expect: fmt.MapExpectation | None = None,
             limits: fmt.MapLimits | None = None) -> fmt.MapSnapshot:
    """Read and validate the map folder ``directory`` (module docstring).

    Args:
        directory: the map folder.
        expect: the running engine's model hash, image size and identity (None: not checked,
            for tools that only inspect a map).
        limits: bounds of the map (default :class:`MapLimits`).

    Returns:
        The map, every check passed.

    Raises:
        MapLoadError: the reason the map is refused.
    """
    limits = limits or fmt.MapLimits()
    folder = Path(directory).expanduser().absolute()
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise MapLoadError(f'{fmt.shown(str(folder))}: not a folder (no map there: '
                           f'{exc.strerror})') from exc
    try:
        return _load(fd, fmt.shown(str(folder)), expect, limits)
    finally:
        os.close(fd)


def _load(fd: int, where: str, expect: fmt.MapExpectation | None, limits: fmt.MapLimits
          ) -> fmt.MapSnapshot:
    try:
        meta = _metadata(fd, limits)
        if expect is not None:
            _check_expectation(meta, expect)
        counts = _check_counts(meta, limits)
        files = _check_files(meta, counts, limits)
        _check_listing(fd, files)
        data = {name: _read(fd, name, entry['bytes'], entry['sha256'])
                for name, entry in files.items()}
        return _snapshot(meta, counts, data)
    except (MapLoadError, ValueError) as exc:
        raise MapLoadError(f'{where}: {exc}') from exc
    except OSError as exc:  # a folder that cannot be listed, say
        raise MapLoadError(f'{where}: cannot read it ({exc.strerror})') from exc


def check_usable(snapshot: fmt.MapSnapshot) -> None:
    """Check a map as the load will, before it is saved: a map we write is one we can read.

    The graph (at least one keyframe and one edge, connected), the plausibility bounds of poses,
    measurements, informations, points and ``frame_from_graph``, and the descriptors' length
    against ``snapshot.identity`` (when recorded).

    Raises:
        ValueError: the reason the load would refuse it.
    """
    graph = snapshot.graph
    graph.check()
    n = graph.num_keyframes
    if n == 0:
        raise ValueError('0 keyframes: nothing to localize in or map into')
    if len(graph.edges_ij) == 0:
        raise ValueError(f'no edge between its {n} keyframes: not a pose graph')
    _check_sim3(graph.poses, 'poses', 'keyframe')
    _check_edges(graph.edges_ij, graph.edges_kind, graph.measurements, graph.informations, n)
    _check_connected(graph.edges_ij, n)
    _frame(np.asarray(snapshot.frame_from_graph, np.float64).reshape(-1).tolist())
    identity = snapshot.identity
    if identity is not None and graph.descriptors.shape[1] != identity.embed_dim:
        raise ValueError(f'descriptors of {graph.descriptors.shape[1]} floats, but its '
                         f"model's embed dim is {identity.embed_dim}")
    _check_points(np.asarray(snapshot.points_xyz, np.float32).reshape(-1, 3))


def _metadata(fd: int, limits: fmt.MapLimits) -> dict[str, Any]:
    raw = _read(fd, fmt.METADATA, None, None, limits.max_metadata_bytes)
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MapLoadError(f'{fmt.METADATA} is not JSON ({fmt.shown(str(exc))})') from exc
    if not isinstance(meta, dict) or meta.get('format') != fmt.FORMAT_NAME:
        raise MapLoadError(f'{fmt.METADATA} is not a {fmt.FORMAT_NAME} file')
    if meta.get('version') != fmt.FORMAT_VERSION:
        raise MapLoadError(f'map format version {fmt.shown(meta.get("version"))}; this node '
                           f'reads version {fmt.FORMAT_VERSION} (save the map again)')
    try:
        sealed = fmt.metadata_checksum_ok(meta)
    except ValueError:  # a value JSON cannot write back (NaN)
        sealed = False
    if not sealed:
        raise MapLoadError(f'{fmt.METADATA}: its {fmt.METADATA_SHA256} does not match its '
                           'content (edited or corrupt)')
    kinds = {'model_hash': str, 'image_size_hw': list, 'intrinsics_source': str,
             'metric': bool, 'created_utc': str, 'counts': dict, 'files': dict,
             'frame_from_graph': list}
    for key, kind in kinds.items():
        if not isinstance(meta.get(key), kind):
            raise MapLoadError(f'{fmt.METADATA}: {key!r} missing or not a {kind.__name__}')
    for key in _TEXTS:
        if len(meta[key]) > fmt.MAX_TEXT_CHARS:
            raise MapLoadError(f'{fmt.METADATA}: {key!r} is {len(meta[key])} characters long; '
                               f'at most {fmt.MAX_TEXT_CHARS} are accepted')
    size = meta['image_size_hw']
    if len(size) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and
                                 0 < v < 1 << 16 for v in size):
        raise MapLoadError(f'image_size_hw {fmt.shown(size)} is not two sizes')
    if meta.get('identity') is not None:
        try:
            meta['identity'] = fmt.ModelIdentity.from_json(meta['identity'])
        except ValueError as exc:
            raise MapLoadError(f'{fmt.METADATA}: {exc}') from exc
    return meta


def _check_expectation(meta: dict[str, Any], expect: fmt.MapExpectation) -> None:
    if meta['model_hash'] != expect.model_hash:
        raise MapLoadError(f'made with another model ({fmt.shown(meta["model_hash"])}; this '
                           f'node runs {fmt.shown(expect.model_hash)})')
    if expect.identity is not None:
        identity = meta.get('identity')
        if identity is None:
            raise MapLoadError('the map records no model identity (preset, embed dim, cache '
                               'settings): it cannot be checked against this node; save it '
                               'again')
        differences = identity.differences(expect.identity)
        if differences:
            raise MapLoadError('made with other model settings: ' + '; '.join(differences))
    if expect.image_size_hw is not None and \
            tuple(meta['image_size_hw']) != tuple(expect.image_size_hw):
        raise MapLoadError(f'made at image size {meta["image_size_hw"]}; this node processes '
                           f'{list(expect.image_size_hw)}')


def _check_counts(meta: dict[str, Any], limits: fmt.MapLimits) -> dict[str, int]:
    bounds = {'keyframes': limits.max_keyframes, 'edges': limits.max_edges,
              'loops': limits.max_edges, 'images': limits.max_keyframes,
              'points': limits.max_points, 'descriptor_dim': limits.max_descriptor_dim}
    counts = meta['counts']
    for key, bound in bounds.items():
        value = counts.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= bound:
            raise MapLoadError(f'count {key!r} = {fmt.shown(value)} is not an integer in '
                               f'0..{bound}')
    if counts['images'] > counts['keyframes'] or counts['loops'] > counts['edges']:
        raise MapLoadError(f'counts do not add up: {fmt.shown(counts)}')
    if counts['keyframes'] == 0:
        raise MapLoadError('0 keyframes: nothing to localize in or map into')
    if counts['edges'] == 0:
        raise MapLoadError(f'no edge between its {counts["keyframes"]} keyframes: not a pose '
                           'graph')
    if counts['descriptor_dim'] < 1:
        raise MapLoadError('descriptor_dim is 0')
    identity = meta.get('identity')
    if identity is not None and counts['descriptor_dim'] != identity.embed_dim:
        raise MapLoadError(f'descriptors of {counts["descriptor_dim"]} floats, but its model\'s '
                           f'embed dim is {identity.embed_dim}')
    return {key: counts[key] for key in bounds}


def _check_files(meta: dict[str, Any], counts: dict[str, int], limits: fmt.MapLimits
                 ) -> dict[str, dict[str, Any]]:
    files = meta['files']
    needed = {f'{name}.npy' for name in _ARRAYS} | {fmt.PLY}
    missing = sorted(needed - set(files))
    if missing:
        raise MapLoadError(f'{fmt.METADATA} lists no {missing[0]}')
    images = {name for name in files if name.startswith(fmt.IMAGE_FOLDER + '/')}
    optional = set(files) & set(fmt.OPTIONAL_FILES)
    if len(images) != counts['images'] or \
            len(files) != len(needed) + len(images) + len(optional):
        raise MapLoadError(f'{fmt.METADATA} lists {len(files)} files: expected the '
                           f'{len(needed)} arrays and PLY, {counts["images"]} images and '
                           f'optionally {", ".join(fmt.OPTIONAL_FILES)}')
    total = 0
    for name, entry in files.items():
        if len(name) > fmt.MAX_TEXT_CHARS or not _NAME.match(name) or '..' in name or \
                name == fmt.METADATA or ('/' in name and name not in images):
            raise MapLoadError(f'file name {fmt.shown(name)} is not a plain name inside the '
                               'map')
        size = entry.get('bytes') if isinstance(entry, dict) else None
        digest = entry.get('sha256') if isinstance(entry, dict) else None
        bound = limits.max_image_bytes if name in images else limits.max_file_bytes
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= bound:
            raise MapLoadError(f'{name}: declared size {fmt.shown(size)} bytes is not in '
                               f'0..{bound}')
        if not isinstance(digest, str) or not re.fullmatch(r'[0-9a-f]{64}', digest):
            raise MapLoadError(f'{name}: no sha256 in {fmt.METADATA}')
        total += size
    if total > limits.max_total_bytes:
        raise MapLoadError(f'declared {total} bytes in all; the limit is '
                           f'{limits.max_total_bytes}')
    return files


def _check_listing(fd: int, files: dict[str, Any]) -> None:
    """Refuse a folder that holds anything but the listed files (a link, a special file).

    The scan stops at the first entry too many, so a folder of a million files costs little.
    """
    top = {name for name in files if '/' not in name} | {fmt.METADATA}
    images = {name.split('/', 1)[1] for name in files if '/' in name}
    _scan(fd, '', top | {fmt.IMAGE_FOLDER}, len(top) + 1)
    try:
        sub = os.open(fmt.IMAGE_FOLDER, _OPEN_FOLDER, dir_fd=fd)
    except FileNotFoundError as exc:
        if images:
            raise MapLoadError(f'{fmt.IMAGE_FOLDER}: missing') from exc
        return
    except OSError as exc:
        raise MapLoadError(f'{fmt.IMAGE_FOLDER} is a symbolic link or not a folder '
                           '(refused)') from exc
    try:
        _scan(sub, fmt.IMAGE_FOLDER + '/', images, len(images))
    finally:
        os.close(sub)


def _scan(fd: int, prefix: str, allowed: set[str], most: int) -> None:
    seen = 0
    with os.scandir(fd) as entries:
        for entry in entries:
            name = prefix + entry.name
            if entry.is_symlink():
                raise MapLoadError(f'{fmt.shown(name)} is a symbolic link (refused)')
            if entry.name not in allowed:
                raise MapLoadError(f'{fmt.shown(name)} is not a file of the map (not listed '
                                   f'in {fmt.METADATA})')
            folder = not prefix and entry.name == fmt.IMAGE_FOLDER
            if not (entry.is_dir(follow_symlinks=False) if folder else
                    entry.is_file(follow_symlinks=False)):
                raise MapLoadError(f'{fmt.shown(name)} is not a regular '
                                   f'{"folder" if folder else "file"}')
            seen += 1
            if seen > most:
                raise MapLoadError(f'more entries in {prefix or "the map folder"} than listed')


def _read(fd: int, name: str, size: int | None, digest: str | None,
          most: int | None = None) -> bytes:
    """Return a file's bytes through the folder's descriptor, never past its declared size.

    ``size`` and ``digest`` are the metadata's (None for the metadata itself, then at most
    ``most`` bytes).
    """
    folder_fd, base = fd, name
    opened = []
    try:
        if '/' in name:
            sub, base = name.split('/', 1)
            try:
                folder_fd = os.open(sub, _OPEN_FOLDER, dir_fd=fd)
            except OSError as exc:
                raise MapLoadError(f'{name}: {sub} is missing, a symbolic link or not a folder '
                                   f'({exc.strerror})') from exc
            opened.append(folder_fd)
        try:
            file_fd = os.open(base, _OPEN_FILE, dir_fd=folder_fd)
        except OSError as exc:
            reason = 'a symbolic link (refused)' if _is_link(folder_fd, base) else \
                f'missing ({exc.strerror})'
            raise MapLoadError(f'{name}: {reason}') from exc
        with os.fdopen(file_fd, 'rb') as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise MapLoadError(f'{name}: not a regular file')
            bound = size if size is not None else int(most or 0)
            if st.st_size > bound or (size is not None and st.st_size != size):
                raise MapLoadError(f'{name}: {st.st_size} bytes, ' + (
                    f'more than {bound}' if size is None else
                    f'{fmt.METADATA} says {size} (truncated or changed)'))
            try:
                data = f.read(bound + 1)
            except OSError as exc:
                raise MapLoadError(f'{name}: cannot read ({exc.strerror})') from exc
    finally:
        for opened_fd in opened:
            os.close(opened_fd)
    if len(data) != st.st_size:
        raise MapLoadError(f'{name}: changed while read')
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        raise MapLoadError(f'{name}: sha256 differs from {fmt.METADATA} (corrupt or changed)')
    return data


def _is_link(fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=fd).st_mode)
    except OSError:
        return False


def _array(data: dict[str, bytes], name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Return a ``.npy``'s array once its header and length are as expected.

    The header must promise ``shape`` and ``dtype``, and the file be exactly that header and
    ``prod(shape) * itemsize`` bytes.
    """
    raw = data[f'{name}.npy']
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        header = (np.lib.format.read_array_header_1_0(stream) if version == (1, 0) else
                  np.lib.format.read_array_header_2_0(stream))
    except (ValueError, OSError, SyntaxError) as exc:
        raise ValueError(f'{name}.npy: not an .npy file ({fmt.shown(str(exc))})') from exc
    got_shape, fortran, got_dtype = header
    if tuple(got_shape) != shape or np.dtype(got_dtype) != np.dtype(dtype) or fortran:
        raise ValueError(f'{name}.npy: {np.dtype(got_dtype).name} {list(got_shape)}, expected '
                         f'{np.dtype(dtype).name} {list(shape)}')
    offset = stream.tell()
    want = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if len(raw) != want:
        raise ValueError(f'{name}.npy: {len(raw)} bytes; its header and shape make {want} '
                         '(trailing or missing bytes)')
    return np.frombuffer(raw, dtype=np.dtype(got_dtype), offset=offset).reshape(shape).copy()


def _snapshot(meta: dict[str, Any], counts: dict[str, int], data: dict[str, bytes]
              ) -> fmt.MapSnapshot:
    n, e, d, k = counts['keyframes'], counts['edges'], counts['descriptor_dim'], counts['images']
    stamps = _array(data, 'stamps_ns', (n,), np.int64)
    poses = _array(data, 'poses', (n, 4, 4), np.float64)
    _check_sim3(poses, 'poses', 'keyframe')
    descriptors = _array(data, 'descriptors', (n, d), np.float32)
    norms = np.linalg.norm(descriptors, axis=1)
    if not (np.isfinite(descriptors).all() and np.allclose(norms, 1.0, atol=1e-3)):
        raise ValueError('descriptors: not finite unit vectors')
    ij = _array(data, 'edges_ij', (e, 2), np.int64)
    kinds = _array(data, 'edges_kind', (e,), np.uint8)
    measurements = _array(data, 'edges_measurement', (e, 4, 4), np.float64)
    informations = _array(data, 'edges_information', (e, 7, 7), np.float64)
    _check_edges(ij, kinds, measurements, informations, n)
    if int((kinds == fmt.KIND_CODES['loop']).sum()) != counts['loops']:
        raise ValueError('the loop count differs from the edges')
    _check_connected(ij, n)
    ids = _array(data, 'image_ids', (k,), np.int64)
    if k and (ids.min() < 0 or ids.max() >= n or (np.diff(ids) <= 0).any()):
        raise ValueError('image_ids: not increasing keyframe numbers')
    images = {}
    for index in ids.tolist():
        jpeg = data.get(fmt.image_name(index))
        if jpeg is None or not jpeg.startswith(b'\xff\xd8'):
            raise ValueError(f'{fmt.image_name(index)}: missing or not a JPEG')
        images[index] = jpeg
    xyz, rgb = _points(data[fmt.PLY], counts['points'])
    extra = {name: data[name] for name in fmt.OPTIONAL_FILES if name in data}
    graph = fmt.KeyframeGraph(stamps_ns=stamps, poses=poses, descriptors=descriptors,
                              edges_ij=ij, edges_kind=kinds, measurements=measurements,
                              informations=informations, images=images)
    return replace(fmt.MapSnapshot(graph=graph, model_hash=meta['model_hash'],
                                   image_size_hw=tuple(meta['image_size_hw'])),
                   intrinsics_source=meta['intrinsics_source'], metric=meta['metric'],
                   points_xyz=xyz, points_rgb=rgb, created_utc=meta['created_utc'],
                   frame_from_graph=_frame(meta['frame_from_graph']),
                   identity=meta.get('identity'), extra_files=extra)


def _check_sim3(matrices: np.ndarray, name: str, what: str) -> None:
    """Refuse all but finite Sim(3) matrices of plausible scale and distance (``map_format``)."""
    sim3.check_poses(matrices, name)
    scales = sim3.scale_of(matrices)
    low, high = fmt.SCALE_RANGE
    bad = np.flatnonzero((scales < low) | (scales > high))
    if len(bad):
        raise ValueError(f'{name}: {what} {int(bad[0])} has scale {float(scales[bad[0]]):.3g}, '
                         f'outside the plausible [{low:g}, {high:g}]')
    reach = np.abs(matrices[:, :3, 3]).max(axis=1) if len(matrices) else np.zeros(0)
    far = np.flatnonzero(reach > fmt.MAX_EXTENT)
    if len(far):
        raise ValueError(f'{name}: {what} {int(far[0])} has a coordinate of '
                         f'{float(reach[far[0]]):.3g}, beyond the plausible {fmt.MAX_EXTENT:g}')


def _check_edges(ij: np.ndarray, kinds: np.ndarray, measurements: np.ndarray,
                 informations: np.ndarray, n: int) -> None:
    """Run the checks of ``pose_graph.check_edge`` on all edges at once, and the bounds."""
    bad = np.flatnonzero((ij < 0).any(axis=1) | (ij >= n).any(axis=1) | (ij[:, 0] == ij[:, 1]))
    if len(bad):
        m = int(bad[0])
        raise ValueError(f'edge {m}: nodes ({int(ij[m, 0])}, {int(ij[m, 1])}) must be two of '
                         f'the {n} nodes')
    unknown = np.flatnonzero(~np.isin(kinds, list(fmt.KIND_NAMES)))
    if len(unknown):
        raise ValueError(f'edge {int(unknown[0])}: unknown kind code '
                         f'{int(kinds[unknown[0]])}')
    _check_sim3(measurements, 'edges_measurement', 'edge')
    finite = np.isfinite(informations).all(axis=(1, 2))
    symmetric = np.isclose(informations, np.swapaxes(informations, 1, 2), rtol=1e-9,
                           atol=1e-12).all(axis=(1, 2))
    bad = np.flatnonzero(~(finite & symmetric))
    if len(bad):
        raise ValueError(f'edge {int(bad[0])}: information must be a finite symmetric [7, 7]')
    with np.errstate(all='ignore'):
        eigen = np.linalg.eigvalsh(informations)
    low = np.flatnonzero(~(eigen[:, 0] > 0))
    if len(low):
        raise ValueError(f'edge {int(low[0])}: information must be positive definite')
    high = np.flatnonzero(~(eigen[:, -1] <= fmt.MAX_INFORMATION))
    if len(high):
        raise ValueError(f'edge {int(high[0])}: information up to {float(eigen[high[0], -1]):.3g}'
                         f', beyond the plausible {fmt.MAX_INFORMATION:g} (a standard '
                         'deviation under 1e-8)')


def _check_connected(ij: np.ndarray, n: int) -> None:
    """Refuse a graph whose keyframes are not all joined to keyframe 0 by edges."""
    parent = np.arange(n)

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = int(parent[a])
        return a
    for a, b in ij.tolist():
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    roots = {root(a) for a in range(n)}
    if len(roots) > 1:
        first = next(a for a in range(n) if root(a) != 0)
        raise ValueError(f'the graph is disconnected: {len(roots)} parts (keyframe {first} is '
                         'not joined to keyframe 0 by any chain of edges)')


def _frame(values: list) -> np.ndarray:
    if len(values) != 16 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                    for v in values):
        raise ValueError('frame_from_graph: need 16 numbers')
    frame = fmt.rigid_frame(np.array(values, np.float64).reshape(4, 4))
    if float(np.abs(frame[:3, 3]).max()) > fmt.MAX_EXTENT:
        raise ValueError(f'frame_from_graph: an offset beyond the plausible {fmt.MAX_EXTENT:g}')
    return frame


def _points(data: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Parse the PLY from the bytes already read and checked (never the path again)."""
    try:
        xyz, rgb = parse_ply(data)
    except ValueError as exc:
        raise ValueError(f'{fmt.PLY}: not a map PLY ({exc})') from exc
    if len(xyz) != count:
        raise ValueError(f'{fmt.PLY}: {len(xyz)} points, metadata says {count}')
    _check_points(xyz)
    return xyz.copy(), rgb.copy()


def _check_points(xyz: np.ndarray) -> None:
    if not np.isfinite(xyz).all():
        raise ValueError(f'{fmt.PLY}: non-finite points')
    far = np.flatnonzero(np.abs(xyz).max(axis=1) > fmt.MAX_EXTENT) if len(xyz) else []
    if len(far):
        raise ValueError(f'{fmt.PLY}: point {int(far[0])} has a coordinate beyond the '
                         f'plausible {fmt.MAX_EXTENT:g}')
