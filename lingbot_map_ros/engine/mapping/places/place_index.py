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
"""Keyframe place index: which earlier keyframes look like the query (global descriptors).

Every keyframe adds one L2-normalised float32 descriptor ``[D]``; a search returns the top
candidates by inner product (cosine) above ``min_score``, never among the query's
``exclude_recent`` most recent keyframes (those are odometry's job, and look alike anyway),
and at most one per run of neighbouring keyframes (``separation``: keyframes of one visit
all match, the best stands for the visit). faiss ``IndexFlatIP`` (exact) searches when installed,
else one numpy matrix product over the stored descriptors (exact too: the same answers).
Memory: ``4 * D`` bytes per keyframe (4 KiB for D = 1024).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lingbot_map_ros.engine.optional_dependencies import faiss_or_none
import numpy as np

_OVERFETCH = 4
"""Extra neighbours fetched per wanted candidate, to survive the suppression of neighbours."""
_SKIP_FETCH = 32
"""Extra neighbours fetched when a ``skip`` test may leave some out."""


@dataclass(frozen=True)
class PlaceCandidate:
    """One retrieved earlier keyframe."""

    index: int
    """Its keyframe number."""
    score: float
    """Inner product of the two descriptors (cosine, in [-1, 1])."""


def normalised(descriptor: np.ndarray, dim: int | None = None) -> np.ndarray:
    """Return ``descriptor`` as float32 ``[D]`` of unit length.

    Raises:
        ValueError: not one-dimensional, the wrong length, non-finite, or zero.
    """
    desc = np.asarray(descriptor, dtype=np.float32)
    if desc.ndim != 1 or (dim is not None and desc.shape[0] != dim):
        raise ValueError(f'descriptor must be [{dim or "D"}], got {desc.shape}')
    norm = float(np.linalg.norm(desc))
    if not np.isfinite(desc).all() or norm == 0:
        raise ValueError('descriptor must be finite and non-zero')
    return desc / norm


class PlaceIndex:
    """Descriptors of every keyframe of a run, searchable by similarity."""

    def __init__(self, *, use_faiss: bool = True) -> None:
        """Start empty; the first descriptor fixes D. ``use_faiss`` False forces numpy."""
        self._faiss = faiss_or_none() if use_faiss else None
        self._index = None
        self._dim: int | None = None
        self._matrix = np.zeros((0, 0), np.float32)
        """The descriptors, rows past ``len(self)`` unused (numpy search only)."""
        self._ids: list[int] = []

    @property
    def backend(self) -> str:
        """'faiss' or 'numpy'."""
        return 'faiss' if self._faiss is not None else 'numpy'

    @property
    def dim(self) -> int | None:
        """Descriptor length, None before the first one."""
        return self._dim

    def __len__(self) -> int:
        """Return the number of indexed keyframes."""
        return len(self._ids)

    @property
    def num_bytes(self) -> int:
        """Bytes the descriptors take (one copy)."""
        return 4 * len(self._ids) * (self.dim or 0)

    def add(self, index: int, descriptor: np.ndarray) -> None:
        """Index keyframe ``index`` (increasing numbers).

        Raises:
            ValueError: a bad descriptor (:func:`normalised`), or ``index`` not above the last.
        """
        desc = normalised(descriptor, self.dim)
        if self._ids and index <= self._ids[-1]:
            raise ValueError(f'keyframe {index} must come after {self._ids[-1]}')
        if self._dim is None:
            self._dim = desc.shape[0]
            if self._faiss is not None:
                self._index = self._faiss.IndexFlatIP(self._dim)
            else:
                self._matrix = np.zeros((64, self._dim), np.float32)
        if self._faiss is not None:
            self._index.add(desc[None])
        else:
            if len(self._ids) == len(self._matrix):
                self._matrix = np.concatenate([self._matrix, np.zeros_like(self._matrix)])
            self._matrix[len(self._ids)] = desc
        self._ids.append(int(index))

    def search(self, descriptor: np.ndarray, query_index: int, *, k: int, min_score: float,
               exclude_recent: int, separation: int,
               skip: Callable[[int], bool] | None = None) -> list[PlaceCandidate]:
        """Best earlier keyframes for a query, best first.

        Args:
            descriptor: the query's descriptor ``[D]``.
            query_index: the query's keyframe number; keyframes numbered above
                ``query_index - exclude_recent`` are never returned.
            k: most candidates returned (>= 1).
            min_score: least inner product of a candidate.
            exclude_recent: number of most recent keyframes left out (>= 0).
            separation: a candidate within this many keyframe numbers of a better one is
                left out (near-duplicates of one visit; 0 keeps them).
            skip: a keyframe number for which it returns True is never a candidate (e.g. a
                near-duplicate of a pair already refused); the ``k`` best are chosen among
                the rest.

        Returns:
            Up to ``k`` candidates; empty when none qualifies or nothing is indexed.

        Raises:
            ValueError: a bad descriptor or argument.
        """
        if k < 1 or exclude_recent < 0 or separation < 0:
            raise ValueError(f'k={k} must be >= 1, exclude_recent={exclude_recent} and '
                             f'separation={separation} >= 0')
        if not self._ids:
            return []
        query = normalised(descriptor, self.dim)
        cutoff = int(np.searchsorted(self._ids, query_index - exclude_recent, side='right'))
        if cutoff == 0:
            return []
        fetch = min(cutoff, k * (_OVERFETCH + 2 * separation) +
                    (_SKIP_FETCH if skip is not None else 0))
        positions, scores = self._nearest(query, cutoff, fetch)
        chosen: list[PlaceCandidate] = []
        for pos, score in zip(positions, scores):
            if score < min_score or len(chosen) == k:
                break
            index = self._ids[pos]
            if skip is not None and skip(index):
                continue
            if all(abs(index - c.index) > separation for c in chosen):
                chosen.append(PlaceCandidate(index, float(score)))
        return chosen

    def _nearest(self, query: np.ndarray, cutoff: int, fetch: int
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Positions and scores of the ``fetch`` best among the first ``cutoff``, best first."""
        if self._faiss is not None:
            params = self._faiss.SearchParameters(sel=self._faiss.IDSelectorRange(0, cutoff))
            scores, positions = self._index.search(query[None], fetch, params=params)
            keep = positions[0] >= 0
            return positions[0][keep], scores[0][keep]
        scores = self._matrix[:cutoff] @ query
        best = np.argpartition(-scores, fetch - 1)[:fetch] if fetch < cutoff \
            else np.arange(cutoff)
        order = best[np.lexsort((best, -scores[best]))]  # ties: the earlier keyframe first
        return order, scores[order]
