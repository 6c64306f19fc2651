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
"""A saved map reused: localization in it from another start, and mapping into it.

A first run drives the route of ``loop_scenes`` twice (the loops close) and is saved and loaded
again (``map_store``). A second run replays the route from another place, in an odometry frame
of its own (another origin, rotation and scale), with drifting odometry; the oracle verifier
sees the true landmarks. Positions are compared in the map's frame (the first run's keyframe 0
is the truth's), in the route's units (a circle of radius 3).

Run: ``pytest test/engine/loop/test_localization.py`` (CPU, needs gtsam; a few seconds).
"""

from dataclasses import replace
from pathlib import Path
import threading

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.mapping.loop_closer import LoopCloser
from lingbot_map_ros.engine.mapping.store.map_format import MapExpectation, MapSnapshot
from lingbot_map_ros.engine.mapping.store.map_store import load_map, save_map
from lingbot_map_ros.engine.mapping.verify.verification import KeyframeRecord
from lingbot_map_ros.loop_config import LoopConfig
from loop_scenes import (DESCRIPTOR_DIM, drifting_route, LandmarkVerifier, noisy, Places,
                         ReplayPlaces, rotation, STEP_SIGMA, WrongFirst)
import numpy as np
import pytest

pytest.importorskip('gtsam')

LAP = 40
START = 15
"""The second run starts at this place of the route."""
LIVE = 30
"""Keyframes of the second run."""
CONFIG = LoopConfig(exclude_recent=10, min_score=0.9, image_store_mb=1.0)
EXPECT = MapExpectation('random:test', (48, 64))
MAX_ERROR = 0.1
"""Mean position error (route units) of the localized live keyframes in the map's frame:
about 3 % of the route's radius; the first run's own map is within about half of that."""


def _record(k: int, pose: np.ndarray, descriptor: np.ndarray) -> KeyframeRecord:
    return KeyframeRecord(index=k, stamp_ns=(k + 1) * 100_000_000, odom_pose=pose,
                          descriptor=descriptor, image=b'\xff\xd8' + bytes(100))


@pytest.fixture(scope='module')
def saved_map(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """Save the first run (two laps, loops closed); return its folder and the truth."""
    truth, odometry, _ = drifting_route(LAP, lap_offset=0.1)
    places = Places(truth, LAP)
    closer = LoopCloser(LandmarkVerifier(lambda k: truth[k], places), CONFIG)
    rng = np.random.default_rng(7)
    try:
        for k in range(len(odometry)):
            closer.add_keyframe(_record(k, odometry[k], places.descriptor(k, rng)))
            assert closer.wait_idle(60.0)
        assert closer.stats()['accepted'] >= 5
        graph = closer.snapshot(30.0)
    finally:
        closer.close()
    folder = save_map(tmp_path_factory.mktemp('maps') / 'route', MapSnapshot(
        graph, EXPECT.model_hash, EXPECT.image_size_hw), durable=False)
    return folder, truth


def _live_run(truth: np.ndarray, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Return the second run's truth and its drifting odometry in a frame of its own."""
    rng = np.random.default_rng(seed)
    live_truth = np.stack([truth[(START + k) % LAP] for k in range(LIVE)])
    frame = sim3.make(rotation([1.0, 2.0, 3.0], 0.7), np.array([5.0, -2.0, 1.0]), 2.5)
    odometry = [frame @ live_truth[0]]
    for k in range(1, LIVE):
        step = sim3.inverse(live_truth[k - 1]) @ live_truth[k]
        odometry.append(odometry[-1] @ noisy(step, rng, STEP_SIGMA, 0.006))
    return live_truth, np.stack(odometry)


def _closer(folder: Path, truth: np.ndarray, mode: str
            ) -> tuple[LoopCloser, ReplayPlaces, LandmarkVerifier]:
    loaded = load_map(folder, EXPECT)
    num_map = loaded.graph.num_keyframes
    places = ReplayPlaces(truth, LAP, num_map, START)
    live_truth, _ = _live_run(truth)

    def truth_of(node: int) -> np.ndarray:
        return truth[node] if node < num_map else live_truth[node - num_map]
    verifier = LandmarkVerifier(truth_of, places)
    return LoopCloser(verifier, CONFIG, seed=loaded.graph, mode=mode), places, verifier


def _position_error(poses: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return np.linalg.norm(poses[:, :3, 3] - truth[:, :3, 3], axis=1)


def test_localization_from_another_start_reaches_the_maps_frame(saved_map) -> None:
    folder, truth = saved_map
    loaded = load_map(folder, EXPECT)
    num_map = loaded.graph.num_keyframes
    live_truth, odometry = _live_run(truth)
    closer, places, verifier = _closer(folder, truth, 'localization')
    rng = np.random.default_rng(11)
    verifier.gate = threading.Event()
    try:
        closer.add_keyframe(_record(0, odometry[0], places.descriptor(num_map, rng)))
        assert closer.map_state == 'searching'  # the first match waits on the gate
        np.testing.assert_allclose(closer.map_from_odom(), np.eye(4), atol=0)
        verifier.gate.set()
        steps = []
        for k in range(1, LIVE):
            assert closer.wait_idle(60.0)
            closer.add_keyframe(_record(k, odometry[k], places.descriptor(num_map + k, rng)))
            assert closer.wait_idle(60.0)
            steps.append(closer.map_from_odom() @ odometry[k])
        stats = closer.stats()
        corrected = closer.corrected_poses()
        snapshot = closer.snapshot(30.0)
    finally:
        closer.close()
    assert stats['map_state'] == 'localized' and stats['map_mode'] == 'localization'
    assert stats['accepted'] >= 3, stats
    # Every match is between a live keyframe and a map keyframe of the same place.
    assert all(c < num_map <= q and places.place(c) == places.place(q)
               for q, c in verifier.calls)
    # The map does not move and is not grown; the live keyframes are in its frame.
    np.testing.assert_allclose(corrected[:num_map], loaded.graph.poses, atol=1e-6)
    assert snapshot is loaded.graph or snapshot.poses.tobytes() == loaded.graph.poses.tobytes()
    live = corrected[num_map:]
    assert len(live) == LIVE
    error = _position_error(live, live_truth)
    assert error.mean() <= MAX_ERROR, error
    # map_from_odom carries the live odometry into the map's frame at every step after the tie.
    followed = _position_error(np.stack(steps), live_truth[1:])
    assert followed.mean() <= MAX_ERROR, followed
    # Without the map, the odometry is nowhere near (another frame and scale).
    assert _position_error(odometry, live_truth).mean() > 10 * MAX_ERROR


def test_mapping_into_a_loaded_map_saves_both_runs(saved_map, tmp_path: Path) -> None:
    folder, truth = saved_map
    loaded = load_map(folder, EXPECT)
    num_map = loaded.graph.num_keyframes
    live_truth, odometry = _live_run(truth)
    closer, places, _ = _closer(folder, truth, 'mapping')
    rng = np.random.default_rng(12)
    try:
        for k in range(LIVE):
            closer.add_keyframe(_record(k, odometry[k], places.descriptor(num_map + k, rng)))
            assert closer.wait_idle(60.0)
        assert closer.map_state == 'localized'
        graph = closer.snapshot(30.0)
    finally:
        closer.close()
    save_map(tmp_path / 'both', MapSnapshot(graph, EXPECT.model_hash, EXPECT.image_size_hw),
             durable=False)
    both = load_map(tmp_path / 'both', EXPECT).graph
    assert both.num_keyframes == num_map + LIVE
    assert both.stamps_ns.tolist() == loaded.graph.stamps_ns.tolist() + \
        [(k + 1) * 100_000_000 for k in range(LIVE)]
    # One chain per run, joined once to the map, and the loops of both runs.
    ij = both.edges_ij
    odometry_edges = ij[both.edges_kind == 0]
    assert len(odometry_edges) == (num_map - 1) + 1 + (LIVE - 1)
    loops = ij[both.edges_kind == 1]
    assert (loops[:, 1] >= num_map).sum() >= 3  # the live run closed loops into the map
    assert sorted(both.images) == list(range(num_map + LIVE))
    error = _position_error(both.poses[num_map:], live_truth)
    assert error.mean() <= MAX_ERROR, error
    # The first run's part moved little (the graph re-optimised with the new loops).
    assert _position_error(both.poses[:num_map], loaded.graph.poses).max() < MAX_ERROR


def test_a_run_that_never_matches_stays_searching_and_is_not_saved(saved_map) -> None:
    folder, truth = saved_map
    num_map = load_map(folder, EXPECT).graph.num_keyframes
    _, odometry = _live_run(truth)
    closer, _, verifier = _closer(folder, truth, 'mapping')
    rng = np.random.default_rng(13)
    try:
        for k in range(LIVE):  # another building: descriptors like no place of the map
            closer.add_keyframe(_record(k, odometry[k], rng.normal(size=DESCRIPTOR_DIM)))
            assert closer.wait_idle(60.0)
        stats = closer.stats()
        graph = closer.snapshot(30.0)
    finally:
        closer.close()
    assert verifier.calls == [] and stats['map_state'] == 'searching'
    np.testing.assert_allclose(stats['map_from_odom'], np.eye(4), atol=0)
    assert graph.num_keyframes == num_map  # the untied run is left out of a save


def test_localization_needs_a_map() -> None:
    with pytest.raises(ValueError, match='needs a loaded map'):
        LoopCloser(LandmarkVerifier(lambda k: np.eye(4), None), CONFIG, mode='localization')


def test_snapshot_while_keyframes_stream_loses_none_and_is_consistent() -> None:
    truth, odometry, _ = drifting_route(LAP, lap_offset=0.1)
    places = Places(truth, LAP)
    verifier = LandmarkVerifier(lambda k: truth[k], places)
    verifier.gate = threading.Event()
    closer = LoopCloser(verifier, CONFIG)
    taken = []
    saver = threading.Thread(target=lambda: taken.append(closer.snapshot(60.0)))
    try:
        for k in range(LAP + 15):  # the first candidate's check now waits on the gate
            closer.add_keyframe(_record(k, odometry[k], places.descriptor(k)))
        saver.start()
        for k in range(LAP + 15, 2 * LAP):  # the frame thread never waits for the save
            closer.add_keyframe(_record(k, odometry[k], places.descriptor(k)))
        verifier.gate.set()
        saver.join(60.0)
        assert closer.wait_idle(60.0)
        stats = closer.stats()
        final = closer.snapshot(30.0)
    finally:
        closer.close()
    assert stats['keyframes'] == 2 * LAP and final.num_keyframes == 2 * LAP
    (graph,) = taken
    n = graph.num_keyframes
    assert 0 < n <= 2 * LAP
    # Consistent: every edge inside the copy, one odometry chain, one stamp per keyframe.
    assert graph.edges_ij.max() < n
    assert (graph.edges_kind == 0).sum() == n - 1
    assert graph.stamps_ns.tolist() == [(k + 1) * 100_000_000 for k in range(n)]
    np.testing.assert_allclose(final.poses[:1], odometry[:1], atol=1e-9)


def test_a_pose_hint_limits_the_first_match_to_its_neighbourhood(saved_map) -> None:
    folder, truth = saved_map
    loaded = load_map(folder, EXPECT)
    num_map = loaded.graph.num_keyframes
    _, odometry = _live_run(truth)
    rng = np.random.default_rng(14)
    far = truth[(START + LAP // 2) % LAP][:3, 3]  # across the circle from the live start
    for hint, tied in (((far, 1.0), False), ((truth[START][:3, 3], 1.0), True)):
        places = ReplayPlaces(truth, LAP, num_map, START)
        verifier = LandmarkVerifier(lambda k: np.eye(4), places)
        verifier.fail = True  # only the calls are looked at here
        closer = LoopCloser(verifier, CONFIG, seed=loaded.graph, mode='localization',
                            hint=hint)
        try:
            closer.add_keyframe(_record(0, odometry[0], places.descriptor(num_map, rng)))
            assert closer.wait_idle(60.0)
        finally:
            closer.close()
        assert (len(verifier.calls) > 0) == tied, verifier.calls
        assert all(np.linalg.norm(loaded.graph.poses[c][:3, 3] - hint[0]) <= 1.0
                   for _, c in verifier.calls)
    with pytest.raises(ValueError, match='hint'):
        LoopCloser(verifier, CONFIG, seed=loaded.graph, mode='localization',
                   hint=(np.array([np.nan, 0.0, 0.0]), 1.0))


def test_a_map_the_graph_cannot_take_fails_loudly_and_drops_nothing_silently(saved_map) -> None:
    folder, truth = saved_map
    graph = load_map(folder, EXPECT).graph
    # Valid for the file format, but the last node has no edge left: the graph cannot hold it.
    keep = (graph.edges_ij != graph.num_keyframes - 1).all(axis=1)
    broken = replace(graph, edges_ij=graph.edges_ij[keep], edges_kind=graph.edges_kind[keep],
                     measurements=graph.measurements[keep],
                     informations=graph.informations[keep])
    closer = LoopCloser(LandmarkVerifier(lambda k: truth[k], None), CONFIG, seed=broken)
    try:
        assert closer.wait_idle(60.0)
        closer.add_keyframe(_record(0, np.eye(4), np.ones(DESCRIPTOR_DIM, np.float32)))
        assert closer.wait_idle(60.0)
        stats = closer.stats()
        with pytest.raises(RuntimeError, match='could not be seeded'):
            closer.snapshot(30.0)
    finally:
        closer.close()
    assert stats['map_state'] == 'failed' and stats['errors'] == 2, stats


def test_a_wrong_first_match_does_not_localize_and_the_true_ones_do(saved_map) -> None:
    folder, truth = saved_map
    loaded = load_map(folder, EXPECT)
    num_map = loaded.graph.num_keyframes
    live_truth, odometry = _live_run(truth)
    places = ReplayPlaces(truth, LAP, num_map, START)
    oracle = LandmarkVerifier(lambda n: truth[n] if n < num_map else live_truth[n - num_map],
                              places)
    verifier = WrongFirst(oracle)
    closer = LoopCloser(verifier, CONFIG, seed=loaded.graph, mode='localization',
                        min_matches=3)
    rng = np.random.default_rng(11)
    states = []
    try:
        for k in range(LIVE):
            closer.add_keyframe(_record(k, odometry[k], places.descriptor(num_map + k, rng)))
            assert closer.wait_idle(60.0)
            states.append((closer.map_state, closer.stats()['map_matches']))
        corrected = closer.corrected_poses()
        edges = closer.loop_edges()
    finally:
        closer.close()
    assert verifier.wrong is not None
    # Searching until three matches agree: the wrong one never counted as localized.
    first = next(k for k, (state, _) in enumerate(states) if state == 'localized')
    assert all(state == 'searching' and matches < 3 for state, matches in states[:first])
    assert all(state == 'localized' for state, _ in states[first:])
    # The wrong match was dropped as inconsistent; the agreeing ones are loop edges.
    wrong = [e for e in edges if (e.query, e.candidate) == verifier.wrong]
    assert len(wrong) == 1 and not wrong[0].accepted and wrong[0].reason == 'inconsistent'
    assert sum(e.accepted for e in edges) >= 3
    error = _position_error(corrected[num_map:], live_truth)
    assert error.mean() <= MAX_ERROR, error
