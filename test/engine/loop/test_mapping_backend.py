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
"""MappingBackend: one owner of loop closure and map reuse, through its short API.

A first run maps the route of ``loop_scenes`` twice through :meth:`MappingBackend.observe`
(loops close) and is saved with :meth:`MappingBackend.save`; a second back end loads it and
localizes; refused maps and requests leave honest states.

Run: ``pytest test/engine/loop/test_mapping_backend.py`` (CPU, needs gtsam; a few seconds).
"""

from pathlib import Path

from lingbot_map_ros.engine.mapping.backend import MappingBackend
from lingbot_map_ros.engine.mapping.store.map_format import MapExpectation, MapSnapshot
from lingbot_map_ros.loop_config import LoopConfig
from loop_scenes import (drifting_route, LandmarkVerifier, Places, ReplayPlaces, WrongFirst)
import numpy as np
import pytest

pytest.importorskip('gtsam')

LAP = 30
START = 7
CONFIG = LoopConfig(exclude_recent=10, min_score=0.9, image_store_mb=1.0)
EXPECT = MapExpectation('random:test', (48, 64))
_JPEG = np.zeros((48, 64, 3), np.uint8)


@pytest.fixture(scope='module')
def mapped(tmp_path_factory) -> tuple[Path, np.ndarray, dict]:
    """Map two laps through the back end and save them; return the folder, truth, stats."""
    truth, odometry, _ = drifting_route(LAP, lap_offset=0.1)
    places = Places(truth, LAP)
    backend = MappingBackend(CONFIG, paced=False)
    backend.use_verifier(LandmarkVerifier(lambda k: truth[k], places))
    rng = np.random.default_rng(3)
    try:
        for k in range(2 * LAP):
            backend.observe((k + 1) * 10**8, odometry[k], places.descriptor(k, rng), _JPEG,
                            EXPECT.image_size_hw)
            assert backend.closer.wait_idle(60.0)
        stats = backend.closer.stats()
        graph, loaded = backend.graph_snapshot(30.0)
        assert loaded is None and graph.num_keyframes == 2 * LAP
        folder = backend.save(tmp_path_factory.mktemp('maps') / 'route',
                              MapSnapshot(graph, EXPECT.model_hash, EXPECT.image_size_hw))
    finally:
        backend.close()
    return folder, truth, stats


def test_observe_closes_loops_and_save_writes_them(mapped) -> None:
    folder, _, stats = mapped
    assert stats['keyframes'] == 2 * LAP and stats['accepted'] >= 5, stats
    assert (folder / 'metadata.json').is_file()


def test_load_then_localize_with_agreeing_matches(mapped) -> None:
    folder, truth, _ = mapped
    backend = MappingBackend(CONFIG, paced=False, localize_matches=2)
    assert backend.published()  # no map: the run is its own map
    loaded = backend.load(folder, EXPECT, 'localization')
    num_map = loaded.graph.num_keyframes
    places = ReplayPlaces(truth, LAP, num_map, START)
    live = [truth[(START + k) % LAP] for k in range(12)]
    backend.use_verifier(LandmarkVerifier(
        lambda n: truth[n] if n < num_map else live[n - num_map], places))
    assert not backend.published() and backend.map_status()['map_state'] == 'searching'
    rng = np.random.default_rng(5)
    try:
        states = []
        for k in range(12):
            backend.observe((k + 1) * 10**8, live[k], places.descriptor(num_map + k, rng),
                            _JPEG, EXPECT.image_size_hw)
            assert backend.closer.wait_idle(60.0)
            states.append(backend.map_status()['map_state'])
        status = backend.map_status()
        published = backend.published()
    finally:
        backend.close()
    assert states[0] == 'searching' and states[-1] == 'localized'
    assert status['map_matches'] == '2/2' and status['map_keyframes'] == num_map
    assert published


def test_refused_map_to_localize_in_publishes_nothing(mapped, tmp_path) -> None:
    backend = MappingBackend(CONFIG, paced=False)
    with pytest.raises(Exception):
        backend.load(tmp_path / 'nowhere', EXPECT, 'localization')
    assert not backend.published() and backend.map_status()['map_state'] == 'refused'
    with pytest.raises(RuntimeError, match='no map loaded'):
        backend.localize(None)
    backend.load(mapped[0], EXPECT, 'localization')  # a valid one: searching, then a tie
    assert backend.map_status()['map_state'] == 'searching' and not backend.published()


def test_a_map_of_another_image_size_is_dropped_with_the_reason(mapped) -> None:
    folder, truth, _ = mapped
    backend = MappingBackend(CONFIG, paced=False)
    backend.use_verifier(LandmarkVerifier(lambda n: truth[n % LAP], Places(truth, LAP)))
    backend.load(folder, MapExpectation(EXPECT.model_hash, None), 'localization')
    try:
        backend.observe(10**8, truth[0], Places(truth, LAP).descriptor(0), None, (96, 128))
        status = backend.map_status()
    finally:
        backend.close()
    assert status['map_state'] == 'refused' and 'image size [48, 64]' in status['map_error']
    assert not backend.published()


def test_a_wrong_tie_is_refuted_by_later_matches_and_the_search_starts_again(mapped) -> None:
    folder, truth, _ = mapped
    backend = MappingBackend(CONFIG, paced=False, localize_matches=1)  # the first match ties
    loaded = backend.load(folder, EXPECT, 'localization')
    num_map = loaded.graph.num_keyframes
    places = ReplayPlaces(truth, LAP, num_map, START)
    live = [truth[(START + k) % LAP] for k in range(LAP)]
    first = [0]  # the route keyframe of the running closer's first live keyframe
    wrong = WrongFirst(LandmarkVerifier(
        lambda n: truth[n] if n < num_map else live[first[0] + n - num_map], places))
    backend.use_verifier(wrong)
    rng = np.random.default_rng(5)
    states, closers = [], set()
    try:
        for k in range(LAP):
            if backend.closer is not None and backend.closer.map_state == 'lost':
                first[0] = k  # this keyframe starts the new search: the oracle follows
                places.start = START + k
            descriptor = places.descriptors[(START + k) % LAP] + \
                rng.normal(scale=0.02, size=places.descriptors.shape[1])
            backend.observe((k + 1) * 10**8, live[k], descriptor, _JPEG, EXPECT.image_size_hw)
            assert backend.closer.wait_idle(60.0)
            closers.add(id(backend.closer))
            states.append(backend.closer.map_state)
        closer = backend.closer
        first_live = num_map  # the new closer's live keyframes are numbered from the map on
        poses = closer.corrected_poses()[first_live:]
        truth_live = np.stack(live[first[0]:])  # the new search's live keyframes
        error = np.linalg.norm(poses[:, :3, 3] - truth_live[:len(poses), :3, 3], axis=1)
        published = backend.published()
        rejudged = closer.stats()['graph_loops_removed']
    finally:
        backend.close()
    assert wrong.wrong is not None
    # Refuted either way: by the map's later matches (one new search), or inside the pose
    # graph, whose re-judging takes the wrong tie out once the later matches outnumber it.
    assert ('lost' in states and len(closers) == 2) or (rejudged >= 1 and len(closers) == 1)
    assert states[-1] == 'localized' and published
    assert len(poses) and error.mean() <= 0.1, error
