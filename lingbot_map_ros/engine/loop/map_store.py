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
"""Save a map folder atomically.

The folder's files are ``map_format.py``'s; ``map_load.py`` reads one back (its ``load_map``
is re-exported here). :func:`save_map` writes every file into a hidden sibling folder
``.<name>.saving-<pid>-<token>``, fsyncs them, and then puts the folder in place with one
rename. An existing map at the path is replaced atomically: the two folders are exchanged in
one ``renameat2(RENAME_EXCHANGE)`` and the old one is removed (where the kernel or file system
cannot exchange, the old map is renamed aside first: a crash between the two renames leaves it
complete in ``.<name>.replaced-<token>``). A path that holds anything but a map (a file, a
link, a folder with other content) is refused. A failure removes the new folder and leaves the
path as it was.
"""

from __future__ import annotations

import ctypes
from datetime import datetime, timezone
import errno
import hashlib
import io
import json
import os
from pathlib import Path
import secrets
import shutil
from typing import Any

from lingbot_map_ros.engine.loop import map_format as fmt
from lingbot_map_ros.engine.loop.map_load import load_map  # noqa: F401 - re-exported
from lingbot_map_ros.engine.map.ply import write_ply
import numpy as np

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def save_map(directory: str | Path, snapshot: fmt.MapSnapshot, *, durable: bool = True
             ) -> Path:
    """Write ``snapshot`` as the map folder ``directory`` (module docstring).

    Args:
        directory: the map folder (its parent is created when missing).
        snapshot: what to write; ``created_utc`` is set to now when empty.
        durable: fsync every file and folder before the rename (off only in tests).

    Returns:
        The map folder, an absolute path.

    Raises:
        ValueError: an inconsistent snapshot, or a path that holds something other than a map.
        OSError: a file cannot be written (nothing at the path changed).
    """
    snapshot.graph.check()
    fmt.rigid_frame(snapshot.frame_from_graph)
    target = Path(directory).expanduser().absolute()
    _check_replaceable(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.parent / f'.{target.name}.saving-{os.getpid()}-{secrets.token_hex(4)}'
    temp.mkdir()
    try:
        _write_folder(temp, snapshot, durable)
        _put_in_place(temp, target, durable)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return target


def _check_replaceable(target: Path) -> None:
    if target.is_symlink():
        raise ValueError(f'{target} is a symbolic link; give the map folder itself')
    if not target.exists():
        return
    if not target.is_dir():
        raise ValueError(f'{target} exists and is not a folder; not replacing it')
    entries = list(target.iterdir())
    if entries and not (target / fmt.METADATA).is_file():
        raise ValueError(f'{target} is a folder with other content than a map '
                         f'(no {fmt.METADATA}); not replacing it')


def _write_folder(folder: Path, snapshot: fmt.MapSnapshot, durable: bool) -> None:
    graph = snapshot.graph
    files: dict[str, dict[str, Any]] = {}

    def put(name: str, data: bytes) -> None:
        path = folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        files[name] = {'bytes': len(data), 'sha256': hashlib.sha256(data).hexdigest()}

    image_ids = np.array(sorted(graph.images), dtype=np.int64)
    arrays = {'stamps_ns': graph.stamps_ns, 'poses': graph.poses,
              'descriptors': graph.descriptors, 'edges_ij': graph.edges_ij,
              'edges_kind': graph.edges_kind, 'edges_measurement': graph.measurements,
              'edges_information': graph.informations, 'image_ids': image_ids}
    for name, array in arrays.items():
        out = io.BytesIO()
        np.save(out, np.ascontiguousarray(array), allow_pickle=False)
        put(f'{name}.npy', out.getvalue())
    (folder / fmt.IMAGE_FOLDER).mkdir()
    for index in image_ids.tolist():
        put(fmt.image_name(index), bytes(graph.images[index]))
    if durable:
        fmt.fsync_folder(folder / fmt.IMAGE_FOLDER)
    write_ply(folder / fmt.PLY, snapshot.points_xyz, snapshot.points_rgb)
    data = (folder / fmt.PLY).read_bytes()
    files[fmt.PLY] = {'bytes': len(data), 'sha256': hashlib.sha256(data).hexdigest()}
    created = snapshot.created_utc or datetime.now(timezone.utc).isoformat(timespec='seconds')
    kinds = graph.edges_kind
    metadata = {
        'format': fmt.FORMAT_NAME, 'version': fmt.FORMAT_VERSION, 'created_utc': created,
        'model_hash': snapshot.model_hash, 'image_size_hw': list(snapshot.image_size_hw),
        'intrinsics_source': snapshot.intrinsics_source, 'metric': bool(snapshot.metric),
        'frame_from_graph': [float(v) for v in
                             fmt.rigid_frame(snapshot.frame_from_graph).reshape(-1)],
        'counts': {'keyframes': graph.num_keyframes, 'edges': int(len(kinds)),
                   'loops': int((kinds == fmt.KIND_CODES['loop']).sum()),
                   'images': int(len(image_ids)), 'points': int(len(snapshot.points_xyz)),
                   'descriptor_dim': int(graph.descriptors.shape[1])},
        'files': files}
    put(fmt.METADATA, json.dumps(metadata, indent=1, sort_keys=True).encode())
    if durable:
        fmt.fsync_folder(folder)


def _put_in_place(temp: Path, target: Path, durable: bool) -> None:
    if not target.exists():
        os.rename(temp, target)  # fails, leaving both, if a folder appeared meanwhile
    elif _exchange(temp, target):
        shutil.rmtree(temp)  # now the old map
    else:
        aside = target.parent / f'.{target.name}.replaced-{secrets.token_hex(4)}'
        os.rename(target, aside)
        os.rename(temp, target)
        shutil.rmtree(aside, ignore_errors=True)
    if durable:
        fmt.fsync_folder(target.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the system cannot (then nothing moved)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f'cannot exchange {a} and {b}: {os.strerror(code)}')
