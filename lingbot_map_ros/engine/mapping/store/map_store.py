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
complete in ``.<name>.replaced-<pid>-<token>``).

A user's files are never deleted: an existing folder is replaced only when it is empty, or when
its ``metadata.json`` parses as this package's map and the folder holds nothing but the files
that metadata lists (no other file, folder or link); anything else at the path (a file, a link,
a folder with other content) is refused with the first foreign entry named. The replaced map is
removed file by file, only the files it lists, so a file that appears meanwhile stays.
A failure removes the new folder and leaves the path as it was.

A save killed midway leaves its hidden sibling behind: :func:`remove_stale_saves` (called by
every save, and by the node at start) removes those of processes that no longer run (or older
than :data:`STALE_AFTER_S`).
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from datetime import datetime, timezone
import errno
import hashlib
import io
import json
import os
from pathlib import Path
import re
import secrets
import shutil
import stat
import time
from typing import Any

from lingbot_map_ros.engine.map.ply import write_ply
from lingbot_map_ros.engine.mapping.store import map_format as fmt
from lingbot_map_ros.engine.mapping.store.map_load import check_usable
from lingbot_map_ros.engine.mapping.store.map_load import load_map  # noqa: F401 - re-exported
import numpy as np

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
STALE_AFTER_S = 24 * 3600.0
"""A hidden save folder this old is stale even when its process id runs again (reused)."""


def save_map(directory: str | Path, snapshot: fmt.MapSnapshot, *, durable: bool = True,
             identity: fmt.ModelIdentity | None = None) -> Path:
    """Write ``snapshot`` as the map folder ``directory`` (module docstring).

    Args:
        directory: the map folder (its parent is created when missing).
        snapshot: what to write; ``created_utc`` is set to now when empty.
        durable: fsync every file and folder before the rename (off only in tests).
        identity: the model and cache settings the map is made with
            (``ModelIdentity.of(engine.config)``), recorded for the load's check; None keeps
            ``snapshot.identity`` (a loaded map saved again), which may be None (not recorded:
            such a map is refused by a load that expects an identity).

    Returns:
        The map folder, an absolute path.

    Raises:
        ValueError: a snapshot the load would refuse (``map_load.check_usable``: no edge, a
            disconnected graph, implausible numbers, descriptors of another length than the
            identity's embed dim), or a path that holds something other than a map.
        OSError: a file cannot be written (nothing at the path changed).
    """
    identity = identity if identity is not None else snapshot.identity
    check_usable(replace(snapshot, identity=identity))
    target = Path(directory).expanduser().absolute()
    _check_replaceable(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_saves(target)
    temp = target.parent / f'.{target.name}.saving-{os.getpid()}-{secrets.token_hex(4)}'
    temp.mkdir()
    try:
        _write_folder(temp, snapshot, durable, identity)
        _put_in_place(temp, target, durable)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return target


def remove_stale_saves(directory: str | Path) -> list[Path]:
    """Remove the hidden folders that killed saves of the map ``directory`` left beside it.

    Only folders named as :func:`save_map` names them (``.<name>.saving-<pid>-<hex>`` and
    ``.<name>.replaced-<pid>-<hex>``; no link) are touched, and only when their process no
    longer runs or they are older than :data:`STALE_AFTER_S`; this process's own are kept (a
    save may be under way in another thread). A ``saving`` folder is the save's own work and
    is removed whole; a ``replaced`` one is an old map, removed file by file (only what its
    metadata lists). Errors are ignored: what cannot be removed stays for the next time.

    Args:
        directory: the map folder (``map.save_path``); it need not exist.

    Returns:
        The folders removed.
    """
    target = Path(directory).expanduser().absolute()
    pattern = re.compile(rf'^\.{re.escape(target.name)}\.(saving|replaced)-(\d+)-[0-9a-f]{{8}}$')
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        match = pattern.match(entry.name)
        if not match or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(match.group(2))
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if pid == os.getpid() or (_process_runs(pid) and age < STALE_AFTER_S):
            continue
        path = Path(entry.path)
        if match.group(1) == 'saving':
            shutil.rmtree(path, ignore_errors=True)
        else:
            _remove_map_files(path)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's process (or a number we cannot ask about): keep it
    return True


def _map_files(folder: Path) -> set[str] | None:
    """Return the names a map folder's metadata lists (with itself), None when it is no map."""
    try:
        fd = os.open(folder / fmt.METADATA, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, 'rb') as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            raw = f.read(fmt.MapLimits().max_metadata_bytes + 1)
        meta = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or meta.get('format') != fmt.FORMAT_NAME or \
            not isinstance(meta.get('files'), dict):
        return None
    return {name for name in meta['files'] if isinstance(name, str)} | {fmt.METADATA}


def _foreign_entry(folder: Path, listed: set[str]) -> str | None:
    """Return the first entry of a map folder that its metadata does not list, or None."""
    for entry in os.scandir(folder):
        if entry.name == fmt.IMAGE_FOLDER and entry.is_dir(follow_symlinks=False):
            for image in os.scandir(entry.path):
                name = f'{fmt.IMAGE_FOLDER}/{image.name}'
                if name not in listed or not image.is_file(follow_symlinks=False):
                    return name
        elif entry.name not in listed or not entry.is_file(follow_symlinks=False):
            return entry.name
    return None


def _remove_map_files(folder: Path) -> None:
    """Delete the files a map folder's metadata lists, then its folders if they are empty."""
    listed = _map_files(folder) or set()
    for name in sorted(listed - {fmt.METADATA}) + [fmt.METADATA]:
        if '/' in name and not name.startswith(fmt.IMAGE_FOLDER + '/'):
            continue
        if '..' in name.split('/'):
            continue
        try:
            os.unlink(folder / name)
        except OSError:
            pass
    for path in (folder / fmt.IMAGE_FOLDER, folder):
        try:
            os.rmdir(path)
        except OSError:
            pass  # something the metadata does not list is there: it stays


def _check_replaceable(target: Path) -> None:
    if target.is_symlink():
        raise ValueError(f'{target} is a symbolic link; give the map folder itself')
    if not target.exists():
        return
    if not target.is_dir():
        raise ValueError(f'{target} exists and is not a folder; not replacing it')
    if not any(True for _ in os.scandir(target)):
        return
    listed = _map_files(target)
    if listed is None:
        raise ValueError(f'{target} is a folder with other content than a map (no '
                         f'{fmt.METADATA} of a {fmt.FORMAT_NAME}); not replacing it')
    foreign = _foreign_entry(target, listed)
    if foreign is not None:
        raise ValueError(f'{target} holds {fmt.shown(foreign)}, which is not part of the map '
                         'there; not replacing it (move it, or save elsewhere)')


def _write_folder(folder: Path, snapshot: fmt.MapSnapshot, durable: bool,
                  identity: fmt.ModelIdentity | None) -> None:
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
    for name, data in sorted(snapshot.extra_files.items()):
        if name not in fmt.OPTIONAL_FILES:
            raise ValueError(f'{fmt.shown(name)} is not a file a map may hold '
                             f'({", ".join(fmt.OPTIONAL_FILES)})')
        put(name, bytes(data))
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
        'identity': identity.as_json() if identity is not None else None,
        'intrinsics_source': snapshot.intrinsics_source, 'metric': bool(snapshot.metric),
        'frame_from_graph': [float(v) for v in
                             fmt.rigid_frame(snapshot.frame_from_graph).reshape(-1)],
        'counts': {'keyframes': graph.num_keyframes, 'edges': int(len(kinds)),
                   'loops': int((kinds == fmt.KIND_CODES['loop']).sum()),
                   'images': int(len(image_ids)), 'points': int(len(snapshot.points_xyz)),
                   'descriptor_dim': int(graph.descriptors.shape[1])},
        'files': files}
    put(fmt.METADATA, fmt.seal_metadata(metadata))
    if durable:
        fmt.fsync_folder(folder)


def _put_in_place(temp: Path, target: Path, durable: bool) -> None:
    if not target.exists():
        os.rename(temp, target)  # fails, leaving both, if a folder appeared meanwhile
    else:
        aside = target.parent / f'.{target.name}.replaced-{os.getpid()}-{secrets.token_hex(4)}'
        if _exchange(temp, target):
            os.rename(temp, aside)  # now the old map: named as one, never removed whole
        else:
            os.rename(target, aside)
            os.rename(temp, target)
        _remove_map_files(aside)
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
