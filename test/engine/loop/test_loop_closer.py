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
"""LoopCloser: loops found, verified and closed off the caller's thread; failures contained.

Run: ``pytest test/engine/loop/test_loop_closer.py`` (CPU, needs gtsam; a few seconds).
"""

import threading

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.mapping.loop_closer import LoopCloser
from lingbot_map_ros.engine.mapping.verify.verification import KeyframeRecord
from lingbot_map_ros.loop_config import LoopConfig
from loop_scenes import ate, drifting_route, LandmarkVerifier, Places
import numpy as np
import pytest

pytest.importorskip('gtsam')

LAP = 40
CONFIG = LoopConfig(exclude_recent=10, min_score=0.9, image_store_mb=1.0,
                    odometry_translation_sigma=0.05, odometry_rotation_sigma=0.01,
                    odometry_scale_sigma=0.01)


def _record(k: int, odometry: np.ndarray, places: Places, rng=None) -> KeyframeRecord:
    return KeyframeRecord(index=k, stamp_ns=(k + 1) * 100_000_000, odom_pose=odometry[k],
                          descriptor=places.descriptor(k, rng), image=b'\xff\xd8' + bytes(100))


def _scene(twins=None):
    truth, odometry, _ = drifting_route(LAP, lap_offset=0.1)
    places = Places(truth, LAP, twins=twins)
    return truth, odometry, places


def _run(closer: LoopCloser, odometry: np.ndarray, places: Places, step_wait: bool = True
         ) -> None:
    rng = np.random.default_rng(7)
    for k in range(len(odometry)):
        closer.add_keyframe(_record(k, odometry, places, rng))
        if step_wait:  # the worker keeps up: every candidate is verified
            assert closer.wait_idle(60.0)
    assert closer.wait_idle(60.0)


def _closed_run(verifier, odometry: np.ndarray, places: Places) -> tuple[dict, np.ndarray]:
    """Feed the route through a closer; return its stats and corrected poses, closed."""
    closer = LoopCloser(verifier, CONFIG)
    try:
        _run(closer, odometry, places)
        return closer.stats(), closer.corrected_poses()
    finally:
        closer.close()


def test_loops_bring_the_map_trajectory_close_to_the_truth() -> None:
    truth, odometry, places = _scene()
    verifier = LandmarkVerifier(lambda k: truth[k], places)
    stats, corrected = _closed_run(verifier, odometry, places)
    assert stats['keyframes'] == 2 * LAP
    assert stats['accepted'] >= 5, stats
    assert stats['rejected_graph'] == 0 and stats['verification_errors'] == 0
    assert all(q - c >= CONFIG.exclude_recent for q, c in verifier.calls)
    assert all(places.place(q) == places.place(c) for q, c in verifier.calls)
    before, after = ate(odometry, truth), ate(corrected, truth)
    assert after <= 0.3 * before, (before, after)
    # map_from_odom maps the last odometry pose onto its corrected pose.
    np.testing.assert_allclose(stats['map_from_odom'] @ odometry[-1], corrected[-1], atol=1e-9)
    assert stats['last_correction_m'] > 0 and np.isfinite(stats['optimisation_ms'])


def test_aliased_room_never_closes_a_loop() -> None:
    # Places 30..39 of the route look exactly like places 0..9 (same descriptors) but hold
    # other furniture; the second lap's real revisits are still found.
    twins = {30 + p: p for p in range(10)}
    truth, odometry, places = _scene(twins)
    verifier = LandmarkVerifier(lambda k: truth[k], places)
    closer = LoopCloser(verifier, CONFIG)
    try:
        _run(closer, odometry, places)
        edges = closer.loop_edges()
    finally:
        closer.close()
    aliased = [e for e in edges if places.place(e.query) != places.place(e.candidate)]
    assert aliased, 'the twins were never retrieved: the test would prove nothing'
    assert not any(e.accepted for e in aliased)
    assert all(e.reason == 'inliers' for e in aliased)
    assert any(e.accepted for e in edges)


def test_slow_verification_blocks_nothing_and_runs_one_at_a_time() -> None:
    truth, odometry, places = _scene()
    verifier = LandmarkVerifier(lambda k: truth[k], places)
    verifier.gate = threading.Event()
    closer = LoopCloser(verifier, CONFIG)
    try:
        # Every keyframe is queued while the first verification waits on the gate: if
        # add_keyframe waited for the worker, this loop would never end.
        for k in range(2 * LAP):
            closer.add_keyframe(_record(k, odometry, places))
        verifier.gate.set()
        assert closer.wait_idle(60.0)
        stats = closer.stats()
    finally:
        closer.close()
    assert stats['keyframes'] == 2 * LAP
    assert verifier.max_concurrent == 1
    assert stats['replaced'] > 0  # newer candidates replaced older ones in the slot of one
    assert stats['verified'] == len(verifier.calls) < stats['candidates']


def test_failing_verifier_is_counted_and_every_keyframe_kept() -> None:
    truth, odometry, places = _scene()
    verifier = LandmarkVerifier(lambda k: truth[k], places)
    verifier.fail = True
    stats, corrected = _closed_run(verifier, odometry, places)
    assert stats['keyframes'] == 2 * LAP
    assert stats['verification_errors'] == len(verifier.calls) > 0
    assert stats['accepted'] == 0
    # Without loops the map is the odometry.
    np.testing.assert_allclose(corrected, odometry, atol=1e-6)
    np.testing.assert_allclose(stats['map_from_odom'], np.eye(4), atol=1e-6)


def test_bad_records_are_refused_at_the_call() -> None:
    truth, odometry, places = _scene()
    closer = LoopCloser(LandmarkVerifier(lambda k: truth[k], places), CONFIG)
    try:
        with pytest.raises(ValueError, match='next one'):
            closer.add_keyframe(_record(3, odometry, places))
        bad = _record(0, odometry, places)
        with pytest.raises(ValueError, match='descriptor'):
            closer.add_keyframe(KeyframeRecord(0, 1, bad.odom_pose, np.zeros(64, np.float32),
                                               None))
        sheared = odometry[0].copy()
        sheared[0, 1] = 0.7
        with pytest.raises(ValueError, match='s \\* R'):
            closer.add_keyframe(KeyframeRecord(0, 1, sheared, bad.descriptor, None))
        closer.add_keyframe(bad)
        assert closer.wait_idle(30.0)
        assert closer.stats()['keyframes'] == 1
        assert sim3.scale_of(closer.corrected_poses())[0] == pytest.approx(1.0)
    finally:
        closer.close()
    with pytest.raises(RuntimeError, match='closed'):
        closer.add_keyframe(_record(1, odometry, places))


class _Visits(Places):
    """Places seen for ``per_visit`` consecutive keyframes each (a visit), ``num`` a lap."""

    def __init__(self, truth: np.ndarray, num: int, per_visit: int, twins: dict[int, int]
                 ) -> None:
        """Place p's landmarks stand before the first lap's keyframe ``per_visit * p``."""
        super().__init__(truth[::per_visit][:num], num, twins=twins)
        self._per_visit = per_visit

    def place(self, keyframe: int) -> int:
        """Return the place of keyframe ``keyframe``."""
        return (keyframe // self._per_visit) % self.num_per_lap


def _look_alike_run(candidates: int) -> tuple[list, _Visits, int]:
    """Two laps of 30 places, 3 keyframes a visit; 5 places look the same (one descriptor).

    Returns the verified pairs, the places and the keyframes of a lap.
    """
    num, per_visit = 30, 3
    alike = (2, 8, 14, 20, 26)
    truth, odometry, _ = drifting_route(num * per_visit, lap_offset=0.1)
    places = _Visits(truth, num, per_visit, {p: alike[0] for p in alike[1:]})
    verifier = LandmarkVerifier(lambda k: truth[k], places)
    config = LoopConfig(**{**CONFIG.__dict__, 'candidates': candidates})
    closer = LoopCloser(verifier, config)
    try:
        _run(closer, odometry, places)
        return closer.loop_edges(), places, num * per_visit
    finally:
        closer.close()


def test_look_alike_places_cannot_hide_the_true_loops() -> None:
    edges, places, lap = _look_alike_run(CONFIG.candidates)
    alike = {2, 8, 14, 20, 26}
    # The look-alikes did outrank the truth: wrong pairs were tried first and refused.
    wrong = [e for e in edges if places.place(e.query) != places.place(e.candidate)]
    assert wrong and not any(e.accepted for e in wrong)
    assert {places.place(e.query) for e in wrong} <= alike
    # Every place of the second lap closed its true loop, the look-alike ones included.
    closed = {places.place(e.query) for e in edges
              if e.accepted and e.query >= lap and places.place(e.query) ==
              places.place(e.candidate)}
    assert closed == set(range(30)), sorted(set(range(30)) - closed)


def test_verifying_only_the_best_candidate_misses_look_alike_loops() -> None:
    """The same route with one candidate a keyframe: the test above would fail without more."""
    edges, places, lap = _look_alike_run(1)
    closed = {places.place(e.query) for e in edges
              if e.accepted and e.query >= lap and places.place(e.query) ==
              places.place(e.candidate)}
    assert not {2, 8, 14, 20, 26} <= closed
