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
"""LoopEstimate: what the loop closer's worker publishes and other threads read.

The corrected keyframe poses, ``map_from_odom`` at the latest keyframe, the latest keyframe's
marginal covariance, every verified pair (:class:`LoopEdgeInfo`), the counters, the last
correction and the state of a loaded map. The worker writes (``loop_closer.py``); the frame
thread, the diagnostics and the outputs read, each under ``lock``: the closer's condition, so
a read is consistent with the closer's queue as well. Values are replaced, not changed in
place, except the list of corrected poses, to which each keyframe's pose is appended.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, replace
import threading
from typing import Any

from lingbot_map_ros.engine import sim3
import numpy as np

COUNTS = ('candidates', 'replaced', 'verified', 'accepted', 'rejected_verification',
          'rejected_graph', 'verification_errors', 'errors', 'skipped')
"""The counters, in the order ``LoopCloser.stats`` gives them."""


@dataclass(frozen=True)
class LoopEdgeInfo:
    """One verified candidate pair, accepted or not (for markers and logs)."""

    query: int
    """The later keyframe's number."""
    candidate: int
    """The earlier keyframe's number."""
    accepted: bool
    """The edge is in the graph."""
    reason: str
    """'ok', the verifier's refusal, or 'residual' (rejected by the graph)."""
    score: float
    """Descriptor similarity of the pair."""
    residual: float
    """The graph's whitened residual of the edge (NaN when it never reached the graph)."""


class LoopEstimate:
    """The closer's latest estimate and counters (module docstring)."""

    def __init__(self, lock: threading.Condition, map_state: str) -> None:
        """Start with no keyframe: ``map_from_odom`` the identity.

        Args:
            lock: the closer's condition (re-entrant: a writer may already hold it).
            map_state: 'none' without a loaded map, else 'searching'.
        """
        self._lock = lock
        self._map_state = map_state
        self._map_from_odom = np.eye(4)
        self._covariance = np.zeros((7, 7))
        self._corrected: list[np.ndarray] = []
        self._edges: list[LoopEdgeInfo] = []
        self._version = 0
        self._counts: collections.Counter = collections.Counter()
        self._last_correction = (0.0, 0.0)
        self._max_correction_m = 0.0
        self._optimisation_ms = float('nan')

    # -- read (any thread) ------------------------------------------------------------------

    def map_from_odom(self) -> np.ndarray:
        """float64 [4, 4] Sim(3) ``map <- odom`` at the latest processed keyframe."""
        with self._lock:
            return self._map_from_odom.copy()

    def covariance(self) -> np.ndarray:
        """Marginal covariance [7, 7] of the latest keyframe (zeros before the first)."""
        with self._lock:
            return self._covariance.copy()

    def corrected_poses(self) -> np.ndarray:
        """float64 [N, 4, 4] map-from-camera of the processed keyframes 0..N-1."""
        with self._lock:
            poses = list(self._corrected)
        return np.stack(poses) if poses else np.zeros((0, 4, 4))

    @property
    def num_keyframes(self) -> int:
        """Keyframes with a corrected pose."""
        with self._lock:
            return len(self._corrected)

    def loop_edges(self) -> list[LoopEdgeInfo]:
        """Every verified pair so far, accepted and rejected."""
        with self._lock:
            return list(self._edges)

    @property
    def version(self) -> int:
        """Increases with every correction."""
        with self._lock:
            return self._version

    @property
    def map_state(self) -> str:
        """'none', 'searching', 'localized', 'lost' (the tie refuted) or 'failed' (not seeded)."""
        with self._lock:
            return self._map_state

    def values(self, queued: int) -> dict[str, Any]:
        """Return the estimate's ``stats`` keys, with ``queued`` keyframes waiting (in order)."""
        with self._lock:
            return {'keyframes': len(self._corrected), 'queued': queued,
                    **{key: self._counts.get(key, 0) for key in COUNTS},
                    'last_correction_m': self._last_correction[0],
                    'last_correction_deg': self._last_correction[1],
                    'max_correction_m': self._max_correction_m,
                    'optimisation_ms': self._optimisation_ms,
                    'map_from_odom': self._map_from_odom.copy(),
                    'map_state': self._map_state}

    # -- write (the closer's worker) --------------------------------------------------------

    def count(self, key: str, num: int = 1) -> None:
        """Add ``num`` to the counter ``key`` (one of :data:`COUNTS`)."""
        with self._lock:
            self._counts[key] += num

    def record(self, info: LoopEdgeInfo, key: str) -> None:
        """Keep a verified pair and count it under ``key``."""
        with self._lock:
            self._edges.append(info)
            self._counts[key] += 1

    def rejudged(self, removed: list[tuple[int, int]], adopted: list[tuple[int, int]]) -> None:
        """Mark verified pairs the graph's re-judging took out (``removed``) or took in.

        Pairs are (query, candidate); a re-judged pair keeps its place in the list, its flag and
        reason change (``rejudged`` when removed, ``ok`` when adopted).
        """
        out, into = set(removed), set(adopted)
        with self._lock:
            for k, info in enumerate(self._edges):
                pair = (info.query, info.candidate)
                if info.accepted and pair in out:
                    self._edges[k] = replace(info, accepted=False, reason='rejudged')
                elif not info.accepted and pair in into:
                    self._edges[k] = replace(info, accepted=True, reason='ok')

    def lose(self) -> None:
        """Mark the tie to the loaded map refuted by later matches: the state becomes 'lost'."""
        with self._lock:
            self._map_state = 'lost'

    def seed_failed(self) -> None:
        """Count the loaded map that could not be seeded; the state becomes 'failed'."""
        with self._lock:
            self._counts['errors'] += 1
            self._map_state = 'failed'

    def seeded(self, poses: list[np.ndarray]) -> None:
        """Take the loaded map's keyframe poses (none when the seed failed)."""
        with self._lock:
            self._corrected = poses

    def add_keyframe(self, corrected: np.ndarray | None, covariance: np.ndarray | None,
                     odom_pose: np.ndarray, num_candidates: int) -> None:
        """Take a new keyframe's graph pose and covariance (None: not in the graph yet).

        ``map_from_odom`` follows the new keyframe when it has a pose.
        """
        with self._lock:
            if covariance is not None:
                self._covariance = covariance
            if corrected is not None:
                self._corrected.append(corrected)
                self._map_from_odom = corrected @ sim3.inverse(odom_pose)
            self._counts['candidates'] += num_candidates

    def timed(self, elapsed_ms: float) -> None:
        """Keep the duration of an optimisation that changed nothing."""
        with self._lock:
            self._optimisation_ms = elapsed_ms

    def correct(self, poses: list[np.ndarray], last: int, odom_pose: np.ndarray,
                covariance: np.ndarray, elapsed_ms: float,
                correction: tuple[float, float] | None = None,
                map_state: str | None = None) -> None:
        """Take the graph's poses after a correction (a loop kept, or the tie to a map).

        Args:
            poses: every keyframe's corrected pose.
            last: the latest keyframe (``map_from_odom`` is taken there).
            odom_pose: its odometry pose.
            covariance: its marginal covariance.
            elapsed_ms: the optimisation's duration.
            correction: (metres, degrees) the latest keyframe moved; None leaves the last
                correction as it was.
            map_state: the loaded map's new state, None to keep it.
        """
        with self._lock:
            self._covariance = covariance
            self._corrected = poses
            self._map_from_odom = poses[last] @ sim3.inverse(odom_pose)
            if correction is not None:
                self._last_correction = correction
                self._max_correction_m = max(self._max_correction_m, correction[0])
            self._optimisation_ms = elapsed_ms
            self._version += 1
            if map_state is not None:
                self._map_state = map_state
