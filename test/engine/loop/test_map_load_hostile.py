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
"""Map folders that cannot be forged or misused (#45 item 6, #46 items 12 and 13).

Each hostile folder is made in a tmp dir from a valid save; an edit the loader should catch only
by its content is sealed again (``seal_metadata``), so the test reaches that check.

Run: ``pytest test/engine/loop/test_map_load_hostile.py`` (CPU, no gtsam; a few seconds).
"""

from dataclasses import replace
import json
import os
from pathlib import Path

from lingbot_map_ros.config import CacheConfig, EngineConfig, ModelConfig
from lingbot_map_ros.engine.errors import MapLoadError
from lingbot_map_ros.engine.map.ply import parse_ply, write_ply
from lingbot_map_ros.engine.mapping.store import map_load, map_store
from lingbot_map_ros.engine.mapping.store.map_format import (KeyframeGraph, MapExpectation,
                                                             MAX_TEXT_CHARS, ModelIdentity, shown)
from lingbot_map_ros.engine.mapping.store.map_load import load_map
from lingbot_map_ros.engine.mapping.store.map_store import save_map
import numpy as np
import pytest
from test_map_store import _edit_metadata, _npy, _rewrite, _snapshot, EXPECT

OFFICIAL = ModelIdentity.of(EngineConfig())
"""The identity the saves below record: embed dim 1024, so the descriptors have 1024 floats."""
EXPECT_ID = replace(EXPECT, identity=OFFICIAL)


def _map(tmp_path: Path, name: str = 'm', **kwargs) -> Path:
    return save_map(tmp_path / name, _snapshot(dim=1024, **kwargs), durable=False,
                    identity=OFFICIAL)


def _meta(folder: Path) -> dict:
    return json.loads((folder / 'metadata.json').read_text())


def _edit_unsealed(folder: Path, **changes) -> None:
    meta = _meta(folder)
    meta.update(changes)
    (folder / 'metadata.json').write_text(json.dumps(meta, indent=1, sort_keys=True))


# -- #45 item 6: every file checksummed, the metadata included; the identity checked ---------

def test_every_metadata_edit_is_refused_by_its_own_checksum(tmp_path: Path) -> None:
    folder = _map(tmp_path)
    assert load_map(folder, EXPECT_ID).identity == OFFICIAL
    frame = _meta(folder)['frame_from_graph']
    shifted = list(frame)
    shifted[3] += 10.0  # frame_from_graph's x offset, 10 m
    changes = ({'frame_from_graph': shifted}, {'image_size_hw': [392, 518]},
               {'model_hash': 'sha256:' + '2' * 64},
               {'identity': {**_meta(folder)['identity'], 'embed_dim': 128}},
               {'metric': False})
    for n, change in enumerate(changes):
        bad = _map(tmp_path, f'edit{n}')
        assert load_map(bad, EXPECT_ID).graph.num_keyframes == 12
        _edit_unsealed(bad, **change)
        with pytest.raises(MapLoadError, match='metadata_sha256 does not match its content'):
            load_map(bad, None)
    meta = _meta(folder)
    del meta['metadata_sha256']
    (folder / 'metadata.json').write_text(json.dumps(meta))
    with pytest.raises(MapLoadError, match='metadata_sha256 does not match'):
        load_map(folder, None)


def test_a_map_of_another_embed_dim_or_cache_is_refused_at_load(tmp_path: Path) -> None:
    folder = _map(tmp_path)
    tiny = ModelIdentity.of(EngineConfig(model=ModelConfig.from_preset('tiny')))
    with pytest.raises(MapLoadError, match=r"model.preset 'official' \(this node: 'tiny'\); "
                                           r'model.embed_dim 1024 \(this node: 128\)'):
        load_map(folder, replace(EXPECT, identity=tiny))
    window = ModelIdentity.of(EngineConfig(cache=CacheConfig(sliding_window=32)))
    with pytest.raises(MapLoadError, match=r'cache.sliding_window 64 \(this node: 32\)'):
        load_map(folder, replace(EXPECT, identity=window))
    fp8 = ModelIdentity.of(EngineConfig(cache=CacheConfig(dtype='float8_e4m3fn')))
    with pytest.raises(MapLoadError, match="cache.dtype 'bfloat16'"):
        load_map(folder, replace(EXPECT, identity=fp8))
    assert _meta(folder)['identity'] == {
        'preset': 'official', 'embed_dim': 1024,
        'cache': {'dtype': 'bfloat16', 'scale_frames': 8, 'sliding_window': 64}}


def test_a_map_without_identity_is_refused_when_one_is_expected(tmp_path: Path) -> None:
    folder = save_map(tmp_path / 'old', _snapshot(dim=1024), durable=False)
    assert _meta(folder)['identity'] is None
    assert load_map(folder, EXPECT).identity is None  # a caller that checks none still loads
    with pytest.raises(MapLoadError, match='records no model identity'):
        load_map(folder, EXPECT_ID)


def test_descriptors_of_another_length_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="descriptors of 32 floats, but its model's embed "
                                         'dim is 1024'):
        save_map(tmp_path / 'x', _snapshot(dim=32), durable=False, identity=OFFICIAL)
    assert not (tmp_path / 'x').exists()
    # Saved with another identity, then the identity edited (and sealed): refused by count.
    folder = save_map(tmp_path / 'm', _snapshot(dim=128), durable=False,
                      identity=ModelIdentity.of(EngineConfig(
                          model=ModelConfig.from_preset('tiny'))))
    meta = _meta(folder)
    _edit_metadata(folder, identity={**meta['identity'], 'preset': 'official',
                                     'embed_dim': 1024})
    with pytest.raises(MapLoadError, match="descriptors of 128 floats, but its model's embed "
                                           'dim is 1024'):
        load_map(folder, EXPECT_ID)


def test_unlisted_files_links_and_special_files_in_the_folder_are_refused(tmp_path: Path
                                                                          ) -> None:
    cases = {
        'notes.txt': lambda f: (f / 'notes.txt').write_text('x'),
        'images/000099.jpg': lambda f: (f / 'images' / '000099.jpg').write_bytes(b'\xff\xd8'),
        'extra': lambda f: (f / 'extra').mkdir(),
        'fifo': lambda f: os.mkfifo(f / 'fifo'),
    }
    for name, make in cases.items():
        folder = _map(tmp_path, name.replace('/', '_'))
        make(folder)
        with pytest.raises(MapLoadError, match=f"'{name}' is not a file of the map"):
            load_map(folder, EXPECT_ID)
    # A listed file replaced by a FIFO: refused without blocking on it.
    folder = _map(tmp_path, 'listed_fifo')
    (folder / 'poses.npy').unlink()
    os.mkfifo(folder / 'poses.npy')
    with pytest.raises(MapLoadError, match="'poses.npy' is not a regular file"):
        load_map(folder, EXPECT_ID)
    # A link inside the image folder, to a file of the same bytes.
    folder = _map(tmp_path, 'image_link')
    image = folder / 'images' / '000002.jpg'
    (tmp_path / 'same.jpg').write_bytes(image.read_bytes())
    image.unlink()
    image.symlink_to(tmp_path / 'same.jpg')
    with pytest.raises(MapLoadError, match="'images/000002.jpg' is a symbolic link"):
        load_map(folder, EXPECT_ID)


# -- #46 item 12: strings from a map are never echoed without bound --------------------------

def test_shown_bounds_any_value() -> None:
    assert shown('abc') == "'abc'"
    long = shown('x' * 30_000_000)
    assert len(long) <= 200 and long.startswith("'xxx") and '...' in long
    nested = shown([list(range(10**6))] * 1000)
    assert len(nested) <= 200
    assert shown('a\nb') == "'a\\nb'"  # a line break cannot forge a log line
    assert len(shown({'k' * 1000: 'v' * 1000})) <= 200


def test_long_metadata_strings_are_refused_and_never_echoed(tmp_path: Path) -> None:
    folder = _map(tmp_path)
    huge = 'sha256:' + 'f' * 30_000_000  # 30 MB
    _edit_metadata(folder, model_hash=huge)
    with pytest.raises(MapLoadError) as caught:
        load_map(folder, EXPECT_ID)
    message = str(caught.value)
    assert "'model_hash' is 30000007 characters long; at most 256" in message
    assert len(message) < 400
    for key, value in (('intrinsics_source', 'i' * (MAX_TEXT_CHARS + 1)),
                       ('created_utc', 'c' * 10**6)):
        folder = _map(tmp_path, key)
        _edit_metadata(folder, **{key: value})
        with pytest.raises(MapLoadError, match=f"'{key}' is {len(value)} characters long"):
            load_map(folder, EXPECT_ID)
    # Values of other types are echoed abbreviated.
    changes = ({'image_size_hw': list(range(10**6))},
               {'counts': {**_meta(folder)['counts'], 'keyframes': 'k' * 10**6}},
               {'version': 'v' * 10**6},
               {'identity': {'preset': 'p' * 10**6, 'embed_dim': 1024, 'cache': {}}})
    reasons = ('image_size_hw', "count 'keyframes'", 'map format version', 'preset')
    for n, (change, reason) in enumerate(zip(changes, reasons)):
        folder = _map(tmp_path, f'other{n}')
        _edit_metadata(folder, **change)
        with pytest.raises(MapLoadError, match=reason) as caught:
            load_map(folder, EXPECT_ID)
        assert len(str(caught.value)) < 500, str(caught.value)[:300]


def test_a_long_file_name_is_refused_and_echoed_bounded(tmp_path: Path) -> None:
    folder = _map(tmp_path)
    meta = _meta(folder)
    meta['files']['images/' + 'a' * 10**6] = meta['files'].pop('images/000000.jpg')
    _edit_metadata(folder, files=meta['files'])
    with pytest.raises(MapLoadError, match=r"file name 'images/aaa.*' is not a plain name") \
            as caught:
        load_map(folder, EXPECT_ID)
    assert len(str(caught.value)) < 500


def test_another_models_hash_is_echoed_bounded(tmp_path: Path) -> None:
    folder = _map(tmp_path)
    running = 'sha256:' + 'e' * 10**6  # the node's own value, as long as it may be
    with pytest.raises(MapLoadError) as caught:
        load_map(folder, MapExpectation(running, None, OFFICIAL))
    assert 'made with another model' in str(caught.value) and len(str(caught.value)) < 600


# -- #46 item 13: maps that load but cannot be used -----------------------------------------

def _graph_snapshot(num: int, ij: list[tuple[int, int]], info: float = 100.0):
    rng = np.random.default_rng(1)
    poses = np.repeat(np.eye(4)[None], num, axis=0)
    poses[:, 0, 3] = np.arange(num, dtype=np.float64)
    step = np.eye(4)
    step[0, 3] = 1.0
    descriptors = rng.normal(size=(num, 1024)).astype(np.float32)
    descriptors /= np.linalg.norm(descriptors, axis=1, keepdims=True)
    e = len(ij)
    graph = KeyframeGraph(
        stamps_ns=np.arange(num, dtype=np.int64), poses=poses, descriptors=descriptors,
        edges_ij=np.array(ij, np.int64).reshape(e, 2), edges_kind=np.zeros(e, np.uint8),
        measurements=np.repeat(step[None], e, axis=0).reshape(e, 4, 4),
        informations=np.repeat(np.eye(7)[None] * info, e, axis=0).reshape(e, 7, 7))
    return replace(_snapshot(dim=1024), graph=graph, identity=OFFICIAL)


UNUSABLE = [
    (0, [], '0 keyframes: nothing to localize in'),
    (3, [], 'no edge between its 3 keyframes'),
    (6, [(0, 1), (1, 2), (3, 4), (4, 5)], r'disconnected: 2 parts \(keyframe 3 is not joined'),
]


def test_an_unusable_graph_is_refused_at_load_with_the_reason(tmp_path: Path,
                                                              monkeypatch) -> None:
    with monkeypatch.context() as patch:  # written as another writer could have
        patch.setattr(map_store, 'check_usable', lambda snapshot: None)
        folders = [save_map(tmp_path / f'g{n}', _graph_snapshot(num, ij), durable=False)
                   for n, (num, ij, _) in enumerate(UNUSABLE)]
    for folder, (_, _, reason) in zip(folders, UNUSABLE):
        with pytest.raises(MapLoadError, match=reason):
            load_map(folder, EXPECT_ID)
    chain = save_map(tmp_path / 'chain', _graph_snapshot(6, [(k, k + 1) for k in range(5)]),
                     durable=False)
    loaded = load_map(chain, EXPECT_ID)
    assert loaded.graph.num_keyframes == 6 and len(loaded.graph.edges_ij) == 5


def test_a_map_the_load_would_refuse_is_not_saved(tmp_path: Path) -> None:
    for n, (num, ij, reason) in enumerate(UNUSABLE):
        with pytest.raises(ValueError, match=reason):
            save_map(tmp_path / f'g{n}', _graph_snapshot(num, ij), durable=False)
    with pytest.raises(ValueError, match=r'edge 0: information up to 1e\+300'):
        save_map(tmp_path / 'i', _graph_snapshot(3, [(0, 1), (1, 2)], info=1e300),
                 durable=False)
    far = _snapshot(dim=1024)
    far.points_xyz[4] = [0.0, 3e6, 0.0]
    with pytest.raises(ValueError, match='point 4 has a coordinate beyond'):
        save_map(tmp_path / 'p', far, durable=False, identity=OFFICIAL)
    assert list(tmp_path.iterdir()) == []  # nothing written, no hidden folder left


@pytest.mark.parametrize('value, reason', [
    (1e300, r'edge 4: information up to 1e\+300, beyond the plausible 1e\+16'),
    (np.inf, r'edge 4: information must be a finite symmetric'),
    (np.nan, r'edge 4: information must be a finite symmetric'),
    (0.0, r'edge 4: information must be positive definite'),
    (-1.0, r'edge 4: information must be positive definite'),
])
def test_implausible_informations_are_refused(tmp_path: Path, value, reason) -> None:
    folder = _map(tmp_path)
    info = _snapshot(dim=1024).graph.informations.copy()
    info[4] = np.zeros((7, 7))
    np.fill_diagonal(info[4], value)
    _rewrite(folder, 'edges_information.npy', _npy(info))
    with pytest.raises(MapLoadError, match=reason):
        load_map(folder, EXPECT_ID)


def test_poses_scales_and_points_beyond_physical_bounds_are_refused(tmp_path: Path) -> None:
    poses = _snapshot(dim=1024).graph.poses.copy()
    cases = []
    far = poses.copy()
    far[7, :3, 3] = [1e300, 0.0, 0.0]
    cases.append(('poses.npy', far, r'poses: keyframe 7 has a coordinate of 1e\+300, beyond '
                                    r'the plausible 1e\+06'))
    big = poses.copy()
    big[2, :3, :3] *= 1e5
    cases.append(('poses.npy', big, r'poses: keyframe 2 has scale 1[.\d]*e\+05, outside the '
                                    r'plausible \[0.001, 1000\]'))
    steps = _snapshot(dim=1024).graph.measurements.copy()
    steps[5, :3, :3] *= 1e-6
    cases.append(('edges_measurement.npy', steps,
                  r'edges_measurement: edge 5 has scale 1[.\d]*e-06, outside'))
    for n, (name, array, reason) in enumerate(cases):
        folder = _map(tmp_path, f'case{n}')
        _rewrite(folder, name, _npy(array))
        with pytest.raises(MapLoadError, match=reason):
            load_map(folder, EXPECT_ID)
    points = ((2e6, r'point 9 has a coordinate beyond the plausible 1e\+06'),
              (np.inf, 'non-finite points'))
    for n, (value, reason) in enumerate(points):
        folder = _map(tmp_path, f'points{n}')
        xyz = np.zeros((50, 3), np.float32)
        xyz[9, 2] = value
        write_ply(tmp_path / 'p.ply', xyz)
        _rewrite(folder, 'map.ply', (tmp_path / 'p.ply').read_bytes())
        with pytest.raises(MapLoadError, match=reason):
            load_map(folder, EXPECT_ID)
    folder = _map(tmp_path, 'frame')
    frame = np.eye(4)
    frame[1, 3] = 5e6
    _edit_metadata(folder, frame_from_graph=frame.reshape(-1).tolist())
    with pytest.raises(MapLoadError, match='frame_from_graph: an offset beyond'):
        load_map(folder, EXPECT_ID)


def test_npy_with_trailing_or_missing_bytes_is_refused(tmp_path: Path) -> None:
    folder = _map(tmp_path)
    data = (folder / 'descriptors.npy').read_bytes()
    _rewrite(folder, 'descriptors.npy', data + bytes(1 << 20))  # 1 MiB of trailing zeros
    with pytest.raises(MapLoadError, match=rf'descriptors.npy: {len(data) + (1 << 20)} bytes; '
                                           rf'its header and shape make {len(data)} \(trailing'):
        load_map(folder, EXPECT_ID)
    _rewrite(folder, 'descriptors.npy', data[:-4])
    with pytest.raises(MapLoadError, match='trailing or missing bytes'):
        load_map(folder, EXPECT_ID)


def test_a_file_larger_than_declared_is_refused_without_reading_it(tmp_path: Path,
                                                                   monkeypatch) -> None:
    folder = _map(tmp_path)
    declared = _meta(folder)['files']['poses.npy']['bytes']
    with open(folder / 'poses.npy', 'ab') as f:
        f.truncate(declared + 2 * 2**30)  # 2 GiB of (sparse) trailing zeros, metadata as is
    read = {}
    real = map_load.os.fdopen

    class Counting:
        """A file whose reads are counted by its size."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def fileno(self):
            return self.f.fileno()

        def read(self, n):
            data = self.f.read(n)
            size = os.fstat(self.f.fileno()).st_size
            read[size] = read.get(size, 0) + len(data)
            return data
    monkeypatch.setattr(map_load.os, 'fdopen', lambda fd, *a, **k: Counting(real(fd, *a, **k)))
    with pytest.raises(MapLoadError, match=rf'poses.npy: {declared + 2 * 2**30} bytes, '
                                           rf'metadata.json says {declared}'):
        load_map(folder, EXPECT_ID)
    assert declared + 2 * 2**30 not in read  # refused from its size: not a byte read
    assert sum(read.values()) < 2**20


def test_the_ply_is_parsed_from_the_checked_bytes_not_the_path(tmp_path: Path,
                                                               monkeypatch) -> None:
    folder = _map(tmp_path)
    want = parse_ply((folder / 'map.ply').read_bytes())
    real_read = map_load._read

    def read_then_swap(fd, name, *args, **kwargs):
        data = real_read(fd, name, *args, **kwargs)
        if name == 'map.ply':  # a swap right after the check: the path now leads elsewhere
            (folder / 'map.ply').unlink()
            (folder / 'map.ply').symlink_to('/dev/zero')
        return data
    monkeypatch.setattr(map_load, '_read', read_then_swap)
    loaded = load_map(folder, EXPECT_ID)
    assert loaded.points_xyz.tobytes() == want[0].tobytes()
    assert loaded.points_rgb.tobytes() == want[1].tobytes()


def test_parse_ply_takes_only_the_exact_layout() -> None:
    xyz = np.array([[1.5, -2.0, 3.25], [0.0, 0.125, -7.0]], np.float32)
    rgb = np.array([[1, 2, 3], [250, 251, 252]], np.uint8)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        write_ply(Path(tmp) / 'a.ply', xyz, rgb)
        data = (Path(tmp) / 'a.ply').read_bytes()
    got_xyz, got_rgb = parse_ply(data)
    assert got_xyz.tobytes() == xyz.tobytes() and got_rgb.tobytes() == rgb.tobytes()
    with pytest.raises(ValueError, match='2 vertices need 30 bytes after the header, the file '
                                         'has 31'):
        parse_ply(data + b'\0')
    with pytest.raises(ValueError, match='has 29'):
        parse_ply(data[:-1])
    with pytest.raises(ValueError, match='not the binary little-endian'):
        parse_ply(data.replace(b'element vertex 2', b'element vertex -2'))
    with pytest.raises(ValueError, match='not the binary little-endian'):
        parse_ply(data.replace(b'property uchar red', b'property float red'))
    with pytest.raises(ValueError, match='no end_header'):
        parse_ply(b'ply\n' + bytes(8192))
