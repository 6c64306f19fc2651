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
"""A loaded map inside the loop closer: its seed, the tie of the live run to it, its export.

The map's N keyframes become nodes 0..N-1 of the closer's pose graph and entries 0..N-1 of its
place index; the live run's keyframe k is node N + k. Until verified matches tie the run to
the map (state ``searching``), the live keyframes are kept aside: they are searched against the
map only, get no graph node, and ``map_from_odom`` stays the identity. Each accepted match
(query q, map keyframe c, relative pose R) proposes an alignment
``map_from_odom = T_c @ R @ inv(O_q)`` (:meth:`LoadedMap.propose`); the run is tied only once
``map.localize_matches`` of them agree (:func:`agree`: where they put the latest keyframe, its
orientation and scale), so one wrong match, however confident, cannot place the robot: it
stays a lone proposal, and when the agreeing ones tie the run it is recorded as rejected
(``inconsistent``). After the tie, :data:`REFUTE_AFTER` verified matches with the map in a row
that the graph rejects refute it (:meth:`LoadedMap.judge`): the state becomes ``lost`` and the
owner (``engine/mapping/backend.py``) starts a new search, so a wrong tie does not lock the run
out of the map. At the tie every kept-aside keyframe joins the graph: the first by a *join*
edge from the newest agreeing match's c (the match carried back along the odometry, with a
weight of :data:`JOIN_WEIGHT` times the match's, so that it only places the node and the loop
edges that follow decide), the rest by their odometry edges, then every agreeing match as a
loop edge (state ``localized``).

Modes:

- ``localization``: every map node is held fixed (a prior each; the map's edges are not
  needed); live keyframes are matched against the map only and never indexed, so the map is
  not grown: a save writes the loaded map unchanged. Later matches are loop edges from a fixed
  map node to the live chain, which refine ``map_from_odom`` as loop closure does.
- ``mapping``: the map's graph is seeded whole (node 0 fixed, its edges); after the tie the
  live keyframes are indexed and closed like any others, and a save holds both runs. Keyframes
  of a run that is never tied are not saved (they have no pose in the map's frame).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.mapping.graph.batch_solve import PoseGraphEdge
from lingbot_map_ros.engine.mapping.graph.pose_graph import LoopOutcome, PoseGraph
from lingbot_map_ros.engine.mapping.places.image_store import ImageStore
from lingbot_map_ros.engine.mapping.places.place_index import PlaceCandidate, PlaceIndex
from lingbot_map_ros.engine.mapping.store import map_format as fmt
from lingbot_map_ros.engine.mapping.verify.verification import KeyframeRecord, Verification
import numpy as np

MapMode = Literal['mapping', 'localization']
MAP_MODES = ('mapping', 'localization')
JOIN_WEIGHT = 1e-6
"""Information of the join edge relative to the first match's (it places, it does not pull)."""
AGREE_SPACINGS = 2.0
"""Two alignments agree when they put the latest keyframe within this many map keyframe
spacings (the median distance between consecutive map keyframes) of each other..."""
AGREE_DEG = 10.0
"""... turned by at most this many degrees ..."""
AGREE_SCALE = 0.2
"""... and scaled alike within this share."""
REFUTE_AFTER = 3
"""Consecutive verified map matches the graph rejects after the tie that refute it (the run
is then 'lost' and searches again), at least ``map.localize_matches``."""
MAX_PROPOSALS = 32
"""Latest proposals kept while searching (older ones have drifted with the odometry)."""


@dataclass(frozen=True)
class Match:
    """An accepted match of a live keyframe with a map keyframe, before the tie."""

    query: KeyframeRecord
    candidate: KeyframeRecord
    result: Verification
    score: float
    alignment: np.ndarray
    """The ``map_from_odom`` it implies, [4, 4] Sim(3)."""


def agree(a: np.ndarray, b: np.ndarray, at: np.ndarray, tolerance: float) -> bool:
    """Return whether alignments ``a`` and ``b`` place the odometry pose ``at`` alike.

    Within ``tolerance`` (map units), :data:`AGREE_DEG` and :data:`AGREE_SCALE`.
    """
    pa, pb = a @ at, b @ at
    if np.linalg.norm(pa[:3, 3] - pb[:3, 3]) > tolerance:
        return False
    turn = np.degrees(sim3.rotation_angle(sim3.rotation_of(a) @ sim3.rotation_of(b).T))
    ratio = float(sim3.scale_of(a)) / float(sim3.scale_of(b))
    return bool(turn <= AGREE_DEG and abs(ratio - 1.0) <= AGREE_SCALE)


class LoadedMap:
    """A loaded map's keyframes and the live run's tie to it (module docstring)."""

    def __init__(self, graph: fmt.KeyframeGraph, mode: MapMode,
                 hint: tuple[np.ndarray, float] | None = None, min_matches: int = 1) -> None:
        """Keep the map and its images (in RAM; they verify the matches).

        Args:
            graph: the loaded map.
            mode: 'localization' or 'mapping'.
            hint: (position [3] in the map's graph frame, radius > 0): until the tie, only
                map keyframes within the radius of the position are candidates.
            min_matches: agreeing matches that tie the run to the map (>= 1).

        Raises:
            ValueError: an unknown mode, an inconsistent graph, a bad hint or ``min_matches``.
        """
        if mode not in MAP_MODES:
            raise ValueError(f'map mode {mode!r} must be one of {MAP_MODES}')
        if int(min_matches) < 1:
            raise ValueError(f'min_matches={min_matches} must be >= 1')
        self.min_matches = int(min_matches)
        self.disagreements = 0
        """Verified map matches the graph rejected in a row since the tie."""
        self.proposals: list[Match] = []
        """Accepted matches not yet tied, oldest first (at most :data:`MAX_PROPOSALS`)."""
        if hint is not None:
            position, radius = np.asarray(hint[0], np.float64), float(hint[1])
            finite = bool(np.isfinite(position).all()) and np.isfinite(radius)
            if position.shape != (3,) or not (finite and radius > 0):
                raise ValueError(f'hint {hint!r} must be a finite position [3] and radius > 0')
            hint = (position, radius)
        self.hint = hint
        graph.check()
        self.graph = graph
        self.mode: MapMode = mode
        self.tied = False
        """The live run is tied to the map (localized)."""
        self.untied: list[KeyframeRecord] = []
        """Live keyframes not yet in the graph (before the tie), in order."""
        self.images = ImageStore(sum(len(j) for j in graph.images.values()))
        for index, jpeg in sorted(graph.images.items()):
            self.images.put(index, jpeg)
        steps = np.linalg.norm(np.diff(graph.poses[:, :3, 3], axis=0), axis=1)
        spacing = float(np.median(steps)) if len(steps) else 0.0
        extent = float(np.ptp(graph.poses[:, :3, 3], axis=0).max()) if len(graph.poses) else 0.0
        self.tolerance = max(AGREE_SPACINGS * spacing, 1e-3 * extent, 1e-9)
        """Distance (map units) within which two alignments agree (:func:`agree`)."""

    def propose(self, graph: PoseGraph, query: KeyframeRecord, candidate: KeyframeRecord,
                result: Verification, score: float) -> list[Match]:
        """Keep an accepted match; return the agreeing matches once there are enough.

        Returns:
            The matches (the newest last) that agree with this one, when they are
            :attr:`min_matches` or more (the caller ties the run with them); else [].
        """
        alignment = graph.pose(candidate.index) @ result.relative @ sim3.inverse(query.odom_pose)
        match = Match(query, candidate, result, score, alignment)
        self.proposals = (self.proposals + [match])[-MAX_PROPOSALS:]
        group = [m for m in self.proposals
                 if agree(m.alignment, alignment, query.odom_pose, self.tolerance)]
        return group if len(group) >= self.min_matches else []

    def judge(self, accepted: bool) -> bool:
        """Count a verified map match after the tie; return True once the tie is refuted."""
        self.disagreements = 0 if accepted else self.disagreements + 1
        return self.disagreements >= max(REFUTE_AFTER, self.min_matches)

    @property
    def best_agreement(self) -> int:
        """Most proposals that agree with one of them (the progress towards the tie)."""
        if not self.proposals:
            return 0
        at = self.proposals[-1].query.odom_pose
        return max(sum(agree(m.alignment, p.alignment, at, self.tolerance)
                       for m in self.proposals) for p in self.proposals)

    @property
    def num_keyframes(self) -> int:
        """N, the map's keyframes (the first live keyframe's node number)."""
        return self.graph.num_keyframes

    @property
    def map_only(self) -> bool:
        """Live keyframes are searched against the map only and not indexed."""
        return self.mode == 'localization' or not self.tied

    @property
    def state(self) -> str:
        """Return 'searching' until the tie, then 'localized'."""
        return 'localized' if self.tied else 'searching'

    def near_hint(self, found: list[PlaceCandidate]) -> list[PlaceCandidate]:
        """Return the candidates within the hint's radius (all of them without a hint)."""
        if self.hint is None:
            return found
        position, radius = self.hint
        return [c for c in found
                if np.linalg.norm(self.graph.poses[c.index][:3, 3] - position) <= radius]

    def seed(self, graph: PoseGraph, index: PlaceIndex) -> dict[int, KeyframeRecord]:
        """Put the map into an empty graph and index; return its keyframes' records.

        A map keyframe's ``odom_pose`` is its pose in the map (the map is its own odometry).
        """
        g = self.graph
        n = g.num_keyframes
        if self.mode == 'localization':
            graph.seed(g.poses, [], fixed=range(n))
        else:
            graph.seed(g.poses, edges_of(g), fixed=(0,) if n else ())
        records = {}
        for k in range(n):
            index.add(k, g.descriptors[k])
            records[k] = KeyframeRecord(index=k, stamp_ns=int(g.stamps_ns[k]),
                                        odom_pose=g.poses[k], descriptor=g.descriptors[k])
        return records

    def join(self, graph: PoseGraph, index: PlaceIndex, group: list[Match],
             odometry_information: Callable[[np.ndarray], np.ndarray]) -> list[LoopOutcome]:
        """Tie the live run to the map by agreeing matches (module docstring).

        Args:
            graph: the closer's graph (the map seeded, no live node yet).
            index: the closer's place index.
            group: the agreeing matches (:meth:`propose`), the newest last.
            odometry_information: the closer's information of an odometry step.

        Returns:
            Each match's outcome as a loop edge, in the order of ``group``.
        """
        newest = group[-1]
        first = self.untied[0]
        to_query = newest.result.relative @ sim3.inverse(newest.query.odom_pose)
        graph.add_node(newest.alignment @ first.odom_pose, PoseGraphEdge(
            newest.candidate.index, first.index, to_query @ first.odom_pose,
            JOIN_WEIGHT * newest.result.information, 'odometry'))
        for previous, record in zip(self.untied, self.untied[1:]):
            measured = sim3.inverse(previous.odom_pose) @ record.odom_pose
            graph.add_node(record.odom_pose, PoseGraphEdge(
                previous.index, record.index, measured, odometry_information(measured),
                'odometry'))
        if self.mode == 'mapping':
            for record in self.untied:
                index.add(record.index, record.descriptor)
        self.tied, self.untied, self.proposals = True, [], []
        # The newest first: it placed the chain, the others then pull on a settled graph.
        outcomes = {id(m): graph.add_loop(PoseGraphEdge(
            m.candidate.index, m.query.index, m.result.relative, m.result.information, 'loop'))
            for m in [newest] + group[:-1]}
        return [outcomes[id(m)] for m in group]


def edges_of(graph: fmt.KeyframeGraph) -> list[PoseGraphEdge]:
    """Return the saved graph's edges as :class:`PoseGraphEdge`."""
    return [PoseGraphEdge(int(i), int(j), m, info, fmt.KIND_NAMES[int(kind)])
            for (i, j), kind, m, info in zip(graph.edges_ij, graph.edges_kind,
                                             graph.measurements, graph.informations)]


def keyframe_graph(poses: np.ndarray, edges: list[PoseGraphEdge],
                   records: list[KeyframeRecord], images: dict[int, bytes]
                   ) -> fmt.KeyframeGraph:
    """Stack a pose graph's nodes and edges and their keyframes into a saveable graph.

    Args:
        poses: float64 [N, 4, 4] the nodes' estimates.
        edges: the graph's edges.
        records: keyframes 0..N-1 (their stamps and descriptors).
        images: JPEG by keyframe number.
    """
    dim = len(records[0].descriptor) if records else 1
    return fmt.KeyframeGraph(
        stamps_ns=np.array([r.stamp_ns for r in records], np.int64),
        poses=np.asarray(poses, np.float64).reshape(-1, 4, 4),
        descriptors=(np.stack([r.descriptor for r in records]).astype(np.float32) if records
                     else np.zeros((0, dim), np.float32)),
        edges_ij=np.array([(e.i, e.j) for e in edges], np.int64).reshape(-1, 2),
        edges_kind=np.array([fmt.KIND_CODES[e.kind] for e in edges], np.uint8),
        measurements=np.array([e.measurement for e in edges], np.float64).reshape(-1, 4, 4),
        informations=np.array([e.information for e in edges], np.float64).reshape(-1, 7, 7),
        images=dict(images))
