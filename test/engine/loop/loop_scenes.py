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
"""Synthetic pose graphs for the loop-closure tests: a route driven twice, drifting odometry.

:func:`drifting_route` returns the ground truth (two laps of a closed route), the odometry
chained from noisy relative measurements whose scale drifts steadily (as a monocular model's
does), and the odometry edges with an information that matches the noise. :func:`loop_edge`
measures a ground-truth relative pose between two nodes, optionally corrupted.
"""

from __future__ import annotations

from dataclasses import replace
import threading
from typing import Any, Callable

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.loop import PoseGraphEdge
from lingbot_map_ros.engine.mapping.verify.verification import (information_from_fit,
                                                                KeyframeRecord,
                                                                relative_sim3_from_points,
                                                                Verification)
import numpy as np

NUM_LANDMARKS = 80
"""Landmarks a place has (points a verifier compares)."""

STEP_SIGMA = np.array([0.01] * 3 + [0.004] * 3 + [0.004])
"""Odometry noise per step: translation (units), rotation (rad), log-scale."""
SCALE_DRIFT = 0.006
"""Log-scale added to every odometry step on top of the noise (a steady scale drift)."""

DESCRIPTOR_DIM = 128
"""The places' descriptor length: the tiny preset's embed dim, as the model's own descriptors
(a saved map records the model and is refused with descriptors of another length)."""


def rotation(axis: np.ndarray, angle: float) -> np.ndarray:
    """Rotation matrix about ``axis`` (Rodrigues)."""
    axis = np.asarray(axis, dtype=np.float64)
    norm = np.linalg.norm(axis)
    if norm == 0 or angle == 0:
        return np.eye(3)
    k = axis / norm
    kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(angle) * kx + (1 - np.cos(angle)) * kx @ kx


def route(num_per_lap: int, laps: int = 2, radius: float = 3.0, lap_offset: float = 0.0
          ) -> np.ndarray:
    """``[num_per_lap * laps, 4, 4]`` world-from-camera poses around a circle, looking ahead.

    Lap ``l`` runs ``l * lap_offset`` higher (y) than the first, so a revisit is not the same
    pose.
    """
    poses = []
    for n in range(num_per_lap * laps):
        angle = 2 * np.pi * n / num_per_lap
        centre = np.array([radius * np.cos(angle),
                           0.2 * np.sin(2 * angle) + (n // num_per_lap) * lap_offset,
                           radius * np.sin(angle)])
        poses.append(sim3.make(rotation([0, 1, 0], -angle), centre))
    return np.stack(poses)


def noisy(measurement: np.ndarray, rng: np.random.Generator, sigma: np.ndarray,
          drift: float = 0.0) -> np.ndarray:
    """``measurement`` followed by a random Sim(3) of standard deviations ``sigma``."""
    d = rng.normal(size=7) * sigma
    return measurement @ sim3.make(rotation(d[3:6], float(np.linalg.norm(d[3:6]))), d[:3],
                                   float(np.exp(d[6] + drift)))


def drifting_route(num_per_lap: int = 40, laps: int = 2, seed: int = 0,
                   lap_offset: float = 0.0
                   ) -> tuple[np.ndarray, np.ndarray, list[PoseGraphEdge]]:
    """Ground truth, drifting odometry poses and their odometry edges.

    Returns:
        ``(truth [N, 4, 4], odometry [N, 4, 4], edges)``; node 0 of the odometry is the truth's.
    """
    rng = np.random.default_rng(seed)
    truth = route(num_per_lap, laps, lap_offset=lap_offset)
    information = np.diag(1.0 / (STEP_SIGMA + np.array([0] * 6 + [SCALE_DRIFT])) ** 2)
    odometry, edges = [truth[0]], []
    for n in range(1, len(truth)):
        measured = noisy(sim3.inverse(truth[n - 1]) @ truth[n], rng, STEP_SIGMA, SCALE_DRIFT)
        odometry.append(odometry[-1] @ measured)
        edges.append(PoseGraphEdge(n - 1, n, measured, information, 'odometry'))
    return truth, np.stack(odometry), edges


def loop_edge(truth: np.ndarray, i: int, j: int, *, sigma: float = 0.01,
              error: np.ndarray | None = None) -> PoseGraphEdge:
    """Return a loop edge measuring the true ``inv(T_i) @ T_j``, times ``error`` when given."""
    measured = sim3.inverse(truth[i]) @ truth[j]
    if error is not None:
        measured = measured @ error
    return PoseGraphEdge(i, j, measured, np.eye(7) / sigma ** 2, 'loop')


def position_error(poses: np.ndarray, truth: np.ndarray) -> float:
    """Mean distance of the camera centres from the truth (no alignment: node 0 is fixed)."""
    return float(np.linalg.norm(poses[:, :3, 3] - truth[:, :3, 3], axis=1).mean())


class Places:
    """What each place looks like: a descriptor and landmarks in the world.

    Keyframe ``k`` of a route with ``num_per_lap`` keyframes a lap is at place
    ``k % num_per_lap``. A place's landmarks are scattered 1-3 units in front of its first
    lap's camera; its descriptor is a random unit vector. ``twins`` maps a place to another
    that looks the same (the same descriptor: two identical rooms) but whose landmarks are
    arranged differently (``moved`` share of them elsewhere).
    """

    def __init__(self, truth: np.ndarray, num_per_lap: int, *, dim: int = DESCRIPTOR_DIM,
                 seed: int = 0, twins: dict[int, int] | None = None, moved: float = 0.8) -> None:
        """Draw every place's descriptor and landmarks."""
        rng = np.random.default_rng(seed)
        self.num_per_lap = num_per_lap
        self.descriptors = rng.normal(size=(num_per_lap, dim)).astype(np.float32)
        self.landmarks = []
        for p in range(num_per_lap):
            local = np.stack([rng.uniform(-1, 1, NUM_LANDMARKS), rng.uniform(-0.5, 0.5,
                              NUM_LANDMARKS), rng.uniform(1, 3, NUM_LANDMARKS)], axis=1)
            self.landmarks.append(local @ truth[p][:3, :3].T + truth[p][:3, 3])
        for twin, original in (twins or {}).items():
            self.descriptors[twin] = self.descriptors[original]
            # Same room, other furniture: most landmarks of the twin sit elsewhere.
            local = (self.landmarks[original] - truth[original][:3, 3]) @ truth[original][:3, :3]
            shuffled = local.copy()
            count = int(moved * NUM_LANDMARKS)
            noise = rng.normal(scale=0.5, size=(count, 3))
            shuffled[:count] = local[rng.permutation(count)] + noise
            self.landmarks[twin] = shuffled @ truth[twin][:3, :3].T + truth[twin][:3, 3]
        self.descriptors /= np.linalg.norm(self.descriptors, axis=1, keepdims=True)

    def place(self, keyframe: int) -> int:
        """Return the place keyframe ``keyframe`` is at."""
        return keyframe % self.num_per_lap

    def descriptor(self, keyframe: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """Keyframe's descriptor: its place's, plus a little noise when ``rng`` is given."""
        desc = self.descriptors[self.place(keyframe)].copy()
        if rng is not None:
            desc += rng.normal(scale=0.02, size=desc.shape).astype(np.float32)
        return desc / np.linalg.norm(desc)


class ReplayPlaces(Places):
    """Places by loop-closer id: a saved map's keyframes, then a replay's.

    Ids below ``num_map`` are the map's keyframes, at the first lap's places; id
    ``num_map + k`` is the replay's frame ``k``, at place ``start + k``.
    """

    def __init__(self, truth: np.ndarray, num_per_lap: int, num_map: int, start: int) -> None:
        """Keep the map's keyframe count and where the replay starts."""
        super().__init__(truth, num_per_lap)
        self.num_map = num_map
        self.start = start

    def place(self, keyframe: int) -> int:
        """Return the place of a loop-closer id (map keyframe or replayed frame)."""
        if keyframe < self.num_map:
            return keyframe % self.num_per_lap
        return (self.start + keyframe - self.num_map) % self.num_per_lap


class LandmarkVerifier:
    """A verifier from the ground truth: both keyframes' views of their places' landmarks.

    The query's landmarks in its camera are fitted onto the candidate's (the same landmark
    numbers) with :func:`relative_sim3_from_points`; a pair whose landmarks mostly disagree
    (another room) is refused. ``units()`` scales the camera coordinates (the odometry's
    units per ground-truth unit). ``gate`` (an Event) makes every call wait for it first,
    ``fail`` makes calls raise; ``calls`` and ``max_concurrent`` record what happened.
    """

    def __init__(self, truth_of: Callable[[int], np.ndarray], places: Places, *,
                 min_inlier_fraction: float = 0.5,
                 units: Callable[[], float] = lambda: 1.0) -> None:
        """Keep the truth and the places."""
        self._truth_of = truth_of
        self._places = places
        self._min_inliers = min_inlier_fraction
        self._units = units
        self.gate: threading.Event | None = None
        self.fail = False
        self.calls: list[tuple[int, int]] = []
        self.max_concurrent = 0
        self._running = 0
        self._lock = threading.Lock()

    def _view(self, keyframe: int) -> np.ndarray:
        pose = self._truth_of(keyframe)
        world = self._places.landmarks[self._places.place(keyframe)]
        return self._units() * ((world - pose[:3, 3]) @ pose[:3, :3])

    def verify(self, query: KeyframeRecord, candidate: KeyframeRecord) -> Verification:
        """Fit the query's landmarks onto the candidate's (``Verifier`` protocol)."""
        with self._lock:
            self._running += 1
            self.max_concurrent = max(self.max_concurrent, self._running)
            self.calls.append((query.index, candidate.index))
        try:
            if self.gate is not None:
                self.gate.wait(60.0)
            if self.fail:
                raise RuntimeError('verifier failure (test)')
            cand, seen = self._view(candidate.index), self._view(query.index)
            fit = relative_sim3_from_points(cand, seen)
            if fit.inlier_fraction < self._min_inliers:
                return Verification(False, 'inliers', fit.matrix, fit.inlier_fraction,
                                    fit.residual, None)
            spread = float(np.sqrt(np.mean(np.sum((cand - cand.mean(0)) ** 2, axis=1))))
            info = information_from_fit(fit, translation_extent=spread, min_sigma=0.05)
            return Verification(True, 'ok', fit.matrix, fit.inlier_fraction, fit.residual,
                                info)
        finally:
            with self._lock:
                self._running -= 1


def ate(poses: np.ndarray, truth: np.ndarray) -> float:
    """RMS camera-centre error after the best Sim(3) alignment (evo's ATE with scale)."""
    from lingbot_map_ros.engine.session.stitching import align_sim3
    rigid = np.array([sim3.make(sim3.rotation_of(p), p[:3, 3]) for p in poses])
    fit = align_sim3(truth, rigid)
    aligned = fit.apply(rigid)
    return float(np.sqrt(np.mean(np.sum((aligned[:, :3, 3] - truth[:, :3, 3]) ** 2, axis=1))))


class WrongFirst:
    """An oracle verifier whose first accepted answer is 1 unit and 30 deg off.

    A confident wrong match; every later answer is the oracle's. ``wrong`` is that pair once given.
    """

    def __init__(self, verifier: Any) -> None:
        """Wrap an oracle verifier (its ``calls`` stay readable here)."""
        self._verifier = verifier
        self.wrong: tuple[int, int] | None = None
        self.calls = verifier.calls

    def verify(self, query: KeyframeRecord, candidate: KeyframeRecord) -> Verification:
        """Answer as the oracle does, the first accepted pair made wrong."""
        result = self._verifier.verify(query, candidate)
        if result.accepted and self.wrong is None:
            self.wrong = (query.index, candidate.index)
            error = sim3.make(rotation([0.0, 0.0, 1.0], np.radians(30.0)),
                              np.array([1.0, 0.0, 0.0]))
            result = replace(result, relative=error @ result.relative)
        return result


class RefuseAll:
    """A verifier no candidate may reach: the graph only grows.

    ``loop.exclude_recent`` covers the run, so a call is a test failure.
    """

    def verify(self, query: KeyframeRecord, candidate: KeyframeRecord) -> Verification:
        """Fail: no candidate was expected."""
        raise AssertionError('no candidate expected')

    def close(self) -> None:
        """Nothing to release."""
