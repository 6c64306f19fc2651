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
"""PlaceIndex (exclusions, near-duplicates, faiss = numpy) and ImageStore (the byte bound).

Run: ``pytest test/engine/loop/test_place_index.py`` (CPU, under a second).
"""

import importlib.util

from lingbot_map_ros.engine.mapping.places.image_store import decode_jpeg, encode_jpeg, ImageStore
from lingbot_map_ros.engine.mapping.places.place_index import PlaceIndex
import numpy as np
import pytest

BACKENDS = [False] + ([True] if importlib.util.find_spec('faiss') else [])
"""numpy always; faiss where installed."""


def _places(num_places: int = 20, dim: int = 32) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(num_places, dim)).astype(np.float32)


def _filled(use_faiss: bool, visits: int = 3, per_visit: int = 3) -> tuple[PlaceIndex, list]:
    """Keyframes 0.. visit places 0..19 in order, ``per_visit`` keyframes per place."""
    places, rng = _places(), np.random.default_rng(1)
    index, where = PlaceIndex(use_faiss=use_faiss), []
    for _ in range(visits):
        for p in range(len(places)):
            for _ in range(per_visit):
                index.add(len(where), places[p] + 0.01 * rng.normal(size=places.shape[1]))
                where.append(p)
    return index, where


@pytest.mark.parametrize('use_faiss', BACKENDS)
def test_search_excludes_recent_and_suppresses_neighbours(use_faiss: bool) -> None:
    index, where = _filled(use_faiss)
    assert index.backend == ('faiss' if use_faiss else 'numpy')
    query = len(where) - 1  # the third visit of place 19
    found = index.search(_places()[19], query, k=5, min_score=0.9, exclude_recent=10,
                         separation=3)
    # One candidate per earlier visit of place 19 (its 3 keyframes are one visit), none of
    # the 10 most recent keyframes.
    assert [where[c.index] for c in found] == [19, 19]
    assert all(c.index <= query - 10 for c in found)
    assert abs(found[0].index - found[1].index) > 3
    assert found[0].score >= found[1].score >= 0.9
    # Without suppression the same visit comes back several times.
    dupes = index.search(_places()[19], query, k=5, min_score=0.9, exclude_recent=10,
                         separation=0)
    assert len(dupes) == 5
    # The earliest keyframes only: nothing is old enough.
    assert index.search(_places()[0], 5, k=3, min_score=0.5, exclude_recent=10,
                        separation=0) == []
    # A threshold above every score.
    assert index.search(-_places()[19], query, k=3, min_score=0.5, exclude_recent=0,
                        separation=0) == []


def test_faiss_and_numpy_agree() -> None:
    if len(BACKENDS) < 2:
        pytest.skip('faiss is not installed')
    results = []
    for use_faiss in (False, True):
        index, where = _filled(use_faiss)
        found = index.search(_places()[7], len(where) - 1, k=4, min_score=0.0,
                             exclude_recent=5, separation=2)
        results.append(found)
    assert [c.index for c in results[0]] == [c.index for c in results[1]]
    np.testing.assert_allclose([c.score for c in results[0]], [c.score for c in results[1]],
                               atol=1e-5)


def test_bad_descriptors_are_refused() -> None:
    index = PlaceIndex(use_faiss=False)
    index.add(0, np.ones(8))
    with pytest.raises(ValueError, match='descriptor'):
        index.add(1, np.ones(9))
    with pytest.raises(ValueError, match='non-zero'):
        index.add(1, np.zeros(8))
    with pytest.raises(ValueError, match='finite'):
        index.add(1, np.full(8, np.nan))
    with pytest.raises(ValueError, match='after'):
        index.add(0, np.ones(8))
    assert len(index) == 1 and index.num_bytes == 32


@pytest.mark.parametrize('in_folder', [False, True])
def test_image_store_keeps_within_its_bound(tmp_path, in_folder: bool) -> None:
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 60, 64)[None, :, None]
    # Smooth images of one main colour each (red, green or blue: the channel order survives).
    images = [np.clip(ramp + np.eye(3)[n % 3] * 150 + rng.uniform(0, 30, 3), 0, 255)
              .astype(np.uint8).repeat(48, axis=0) for n in range(12)]
    jpegs = [encode_jpeg(image) for image in images]
    bound = sum(len(j) for j in jpegs[:5])
    store = ImageStore(bound, tmp_path / 'kf' if in_folder else None)
    for n, jpeg in enumerate(jpegs):
        assert store.put(n, jpeg)
        assert store.num_bytes <= bound
    kept = [n for n in range(12) if n in store]
    assert kept == list(range(12 - len(kept), 12))  # the newest, in a ring
    assert 3 <= len(kept) <= 6 and store.num_evicted == 12 - len(kept)
    assert store.get(0) is None and store.get(11) == jpegs[11]
    decoded = decode_jpeg(store.get(11))
    assert decoded.shape == (48, 64, 3)
    assert np.abs(decoded.astype(float) - images[11]).mean() < 4  # lossy, but that image
    assert decoded[..., 2].mean() > decoded[..., 0].mean() + 100  # image 11 is blue
    if in_folder:
        assert sorted(p.name for p in (tmp_path / 'kf').iterdir()) == \
            sorted(f'{n}.jpg' for n in kept)
    assert not store.put(99, bytes(bound + 1))  # larger than the whole bound
    store.clear()
    assert len(store) == 0 and store.num_bytes == 0
    with pytest.raises(ValueError, match='decodable'):
        decode_jpeg(b'not a jpeg')
