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
"""Map folders: saved atomically, read back bit-exact, hostile ones refused with the reason.

Run: ``pytest test/engine/loop/test_map_store.py`` (CPU, no gtsam needed; about a second).
"""

import hashlib
import json
import os
from pathlib import Path

from lingbot_map_ros.engine.errors import MapLoadError
from lingbot_map_ros.engine.mapping.places.image_store import encode_jpeg
from lingbot_map_ros.engine.mapping.store import map_load, map_store
from lingbot_map_ros.engine.mapping.store.map_format import (KeyframeGraph, MapExpectation,
                                                             MapLimits, MapSnapshot, seal_metadata)
from lingbot_map_ros.engine.mapping.store.map_load import load_map
from lingbot_map_ros.engine.mapping.store.map_store import save_map
from loop_scenes import drifting_route
import numpy as np
import pytest

EXPECT = MapExpectation(model_hash='sha256:' + '1' * 64, image_size_hw=(294, 518))


def _snapshot(num: int = 12, dim: int = 32, seed: int = 0) -> MapSnapshot:
    rng = np.random.default_rng(seed)
    _, odometry, edges = drifting_route(num // 2, laps=2, seed=seed)
    descriptors = rng.normal(size=(num, dim)).astype(np.float32)
    descriptors /= np.linalg.norm(descriptors, axis=1, keepdims=True)
    loop = np.eye(4)
    loop[:3, 3] = rng.normal(size=3)
    ij = [(e.i, e.j) for e in edges] + [(0, num - 1)]
    images = {k: encode_jpeg(rng.integers(0, 255, (8, 12, 3), dtype=np.uint8))
              for k in range(0, num, 2)}
    graph = KeyframeGraph(
        stamps_ns=np.arange(num, dtype=np.int64) * 33_000_000 + 7, poses=odometry,
        descriptors=descriptors, edges_ij=np.array(ij, np.int64),
        edges_kind=np.array([0] * len(edges) + [1], np.uint8),
        measurements=np.stack([e.measurement for e in edges] + [loop]),
        informations=np.stack([e.information for e in edges] + [np.eye(7) * 123.25]),
        images=images)
    xyz = rng.normal(size=(50, 3)).astype(np.float32)
    rgb = rng.integers(0, 255, (50, 3), dtype=np.uint8)
    frame = np.eye(4)
    angle = 0.3 + seed
    frame[:2, :2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    frame[:3, 3] = [1.0 / 3.0, -2.5, 0.125]
    return MapSnapshot(graph=graph, model_hash=EXPECT.model_hash,
                       image_size_hw=EXPECT.image_size_hw, intrinsics_source='model',
                       metric=True, points_xyz=xyz, points_rgb=rgb, frame_from_graph=frame)


def _rewrite(folder: Path, name: str, data: bytes) -> None:
    """Replace a file and fix its entry in the metadata (only later checks can catch it)."""
    (folder / name).write_bytes(data)
    meta = json.loads((folder / 'metadata.json').read_text())
    meta['files'][name] = {'bytes': len(data), 'sha256': hashlib.sha256(data).hexdigest()}
    (folder / 'metadata.json').write_bytes(seal_metadata(meta))


def _edit_metadata(folder: Path, **changes) -> None:
    """Change metadata values and seal it again (only later checks can catch them)."""
    meta = json.loads((folder / 'metadata.json').read_text())
    meta.update(changes)
    (folder / 'metadata.json').write_bytes(seal_metadata(meta))


def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    snap = _snapshot()
    folder = save_map(tmp_path / 'office', snap, durable=False)
    assert folder == (tmp_path / 'office').absolute()
    loaded = load_map(folder, EXPECT)
    a, b = snap.graph, loaded.graph
    for name in ('stamps_ns', 'poses', 'descriptors', 'edges_ij', 'edges_kind',
                 'measurements', 'informations'):
        assert getattr(a, name).dtype == getattr(b, name).dtype, name
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name
    assert b.images == a.images and sorted(b.images) == list(range(0, 12, 2))
    assert loaded.points_xyz.tobytes() == snap.points_xyz.tobytes()
    assert loaded.points_rgb.tobytes() == snap.points_rgb.tobytes()
    assert loaded.frame_from_graph.tobytes() == snap.frame_from_graph.tobytes()
    assert (loaded.model_hash, loaded.image_size_hw, loaded.metric) == \
        (EXPECT.model_hash, (294, 518), True)
    meta = json.loads((folder / 'metadata.json').read_text())
    assert meta['counts'] == {'keyframes': 12, 'edges': 12, 'loops': 1, 'images': 6,
                              'points': 50, 'descriptor_dim': 32}
    assert loaded.created_utc == meta['created_utc'] != ''
    for name, entry in meta['files'].items():
        data = (folder / name).read_bytes()
        assert entry == {'bytes': len(data), 'sha256': hashlib.sha256(data).hexdigest()}
    assert not any(b'pickle' in (folder / n).read_bytes()[:128] for n in meta['files'])
    assert sorted(p.name for p in tmp_path.iterdir()) == ['office']


def test_a_second_save_replaces_the_map_atomically(tmp_path: Path) -> None:
    save_map(tmp_path / 'm', _snapshot(seed=1), durable=False)
    second = _snapshot(num=16, seed=2)
    save_map(tmp_path / 'm', second, durable=True)
    loaded = load_map(tmp_path / 'm', EXPECT)
    assert loaded.graph.poses.tobytes() == second.graph.poses.tobytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['m']


def test_a_path_that_is_not_a_map_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / 'notes').mkdir()
    (tmp_path / 'notes' / 'todo.txt').write_text('keep me')
    with pytest.raises(ValueError, match='other content than a map'):
        save_map(tmp_path / 'notes', _snapshot(), durable=False)
    (tmp_path / 'file').write_text('x')
    with pytest.raises(ValueError, match='not a folder'):
        save_map(tmp_path / 'file', _snapshot(), durable=False)
    assert (tmp_path / 'notes' / 'todo.txt').read_text() == 'keep me'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['file', 'notes']


@pytest.mark.parametrize('existing', [False, True])
def test_a_crash_mid_save_leaves_no_half_map(tmp_path: Path, monkeypatch, existing) -> None:
    old = _snapshot(seed=3)
    if existing:
        save_map(tmp_path / 'm', old, durable=False)

    def failing_write(*args, **kwargs):
        raise OSError(28, 'No space left on device (test)')
    monkeypatch.setattr(map_store, 'write_ply', failing_write)
    with pytest.raises(OSError, match='No space left'):
        save_map(tmp_path / 'm', _snapshot(seed=4), durable=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == (['m'] if existing else [])
    if existing:
        assert load_map(tmp_path / 'm', EXPECT).graph.poses.tobytes() == \
            old.graph.poses.tobytes()


def _saved(tmp_path: Path) -> Path:
    return save_map(tmp_path / 'm', _snapshot(), durable=False)


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    data = (folder / 'descriptors.npy').read_bytes()
    (folder / 'descriptors.npy').write_bytes(data[:len(data) // 2])
    with pytest.raises(MapLoadError, match=r'descriptors.npy: \d+ bytes, .* says \d+ \(truncated'):
        load_map(folder, EXPECT)


def test_changed_bytes_fail_the_checksum(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    data = bytearray((folder / 'images/000004.jpg').read_bytes())
    data[-3] ^= 0xFF
    (folder / 'images/000004.jpg').write_bytes(bytes(data))
    with pytest.raises(MapLoadError, match='000004.jpg: sha256 differs'):
        load_map(folder, EXPECT)


def test_wrong_version_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    _edit_metadata(folder, version=1)
    with pytest.raises(MapLoadError, match='format version 1; this node reads version 2'):
        load_map(folder, EXPECT)


def test_other_model_or_image_size_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    with pytest.raises(MapLoadError, match='made with another model'):
        load_map(folder, MapExpectation('sha256:' + '2' * 64, (294, 518)))
    with pytest.raises(MapLoadError, match=r'image size \[294, 518\]; .* \[392, 518\]'):
        load_map(folder, MapExpectation(EXPECT.model_hash, (392, 518)))


def test_ten_gigabyte_declared_size_is_refused_unread(tmp_path: Path, monkeypatch) -> None:
    folder = _saved(tmp_path)
    meta = json.loads((folder / 'metadata.json').read_text())
    meta['files']['descriptors.npy']['bytes'] = 10 * 10**9
    (folder / 'metadata.json').write_bytes(seal_metadata(meta))
    opened = []
    real_open = os.open
    monkeypatch.setattr(map_load.os, 'open',
                        lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    with pytest.raises(MapLoadError, match='declared size 10000000000 bytes'):
        load_map(folder, EXPECT)
    # The folder, then its metadata: nothing else was opened.
    assert [Path(p).name for p in opened] == ['m', 'metadata.json']
    # The total is bounded too (each file under its own bound).
    meta['files']['descriptors.npy']['bytes'] = 3 * 2**30
    meta['files']['poses.npy']['bytes'] = 3 * 2**30
    meta['files']['map.ply']['bytes'] = 3 * 2**30
    (folder / 'metadata.json').write_bytes(seal_metadata(meta))
    with pytest.raises(MapLoadError, match='in all; the limit is'):
        load_map(folder, EXPECT)


def test_huge_counts_are_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    meta = json.loads((folder / 'metadata.json').read_text())
    meta['counts']['keyframes'] = 10**9
    (folder / 'metadata.json').write_bytes(seal_metadata(meta))
    with pytest.raises(MapLoadError, match="count 'keyframes' = 1000000000"):
        load_map(folder, EXPECT)
    with pytest.raises(MapLoadError, match='not an integer'):
        load_map(folder, EXPECT, MapLimits(max_keyframes=5))


def test_symbolic_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    outside = tmp_path / 'outside.npy'
    outside.write_bytes((folder / 'poses.npy').read_bytes())  # same bytes, same sha256
    (folder / 'poses.npy').unlink()
    (folder / 'poses.npy').symlink_to(outside)
    with pytest.raises(MapLoadError, match="'poses.npy' is a symbolic link"):
        load_map(folder, EXPECT)
    # A linked image folder is refused the same way.
    folder2 = save_map(tmp_path / 'm2', _snapshot(), durable=False)
    (folder2 / 'images').rename(tmp_path / 'elsewhere')
    (folder2 / 'images').symlink_to(tmp_path / 'elsewhere')
    with pytest.raises(MapLoadError, match="'images' is a symbolic link"):
        load_map(folder2, EXPECT)


def test_a_name_leaving_the_folder_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    meta = json.loads((folder / 'metadata.json').read_text())
    meta['files']['images/../../secret'] = meta['files'].pop('images/000000.jpg')
    (folder / 'metadata.json').write_bytes(seal_metadata(meta))
    with pytest.raises(MapLoadError, match='not a plain name inside the map'):
        load_map(folder, EXPECT)


def _npy(array: np.ndarray) -> bytes:
    import io
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def test_non_finite_or_sheared_pose_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    poses = _snapshot().graph.poses.copy()
    poses[5, 0, 3] = np.nan
    _rewrite(folder, 'poses.npy', _npy(poses))  # checksums valid: the content check refuses
    with pytest.raises(MapLoadError, match='poses: non-finite values'):
        load_map(folder, EXPECT)
    poses[5, 0, 3] = 1.0
    poses[5, 0, 1] = 0.5
    _rewrite(folder, 'poses.npy', _npy(poses))
    with pytest.raises(MapLoadError, match='not s \\* R'):
        load_map(folder, EXPECT)


def test_an_array_of_another_shape_or_a_pickle_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    _rewrite(folder, 'edges_ij.npy', _npy(np.zeros((3, 2), np.int64)))
    with pytest.raises(MapLoadError, match=r'edges_ij.npy: int64 \[3, 2\], expected int64 '
                                           r'\[12, 2\]'):
        load_map(folder, EXPECT)
    folder = save_map(tmp_path / 'p', _snapshot(), durable=False)
    # An object array's header (a pickle would follow): refused from the header alone.
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (12,), }".ljust(117) + b'\n'
    _rewrite(folder, 'stamps_ns.npy', b'\x93NUMPY\x01\x00v\x00' + header + b'\x80\x04N.')
    with pytest.raises(MapLoadError, match='stamps_ns.npy: object'):
        load_map(folder, EXPECT)


def test_bad_edge_information_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    info = _snapshot().graph.informations.copy()
    info[3] = -np.eye(7)
    _rewrite(folder, 'edges_information.npy', _npy(info))
    with pytest.raises(MapLoadError, match='edge 3: information must be positive definite'):
        load_map(folder, EXPECT)


def test_a_frame_that_is_not_rigid_is_refused(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    _edit_metadata(folder, frame_from_graph=(2.0 * np.eye(4)).reshape(-1).tolist())
    with pytest.raises(MapLoadError, match='bottom row|rigid'):
        load_map(folder, EXPECT)
    scaled = np.diag([2.0, 2.0, 2.0, 1.0])
    _edit_metadata(folder, frame_from_graph=scaled.reshape(-1).tolist())
    with pytest.raises(MapLoadError, match='frame_from_graph must be rigid'):
        load_map(folder, EXPECT)
