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
"""LoopSteps: the loop closer's work, one step at a time, on its worker thread.

``loop_closer.LoopCloser`` owns the thread, the queue and the slot of the pending candidate;
it calls these steps in order and nothing else touches the graph, the place index, the image
store or the records. Every result goes to the :class:`LoopEstimate` (which other threads read
under its lock); the steps themselves take no lock:

- :meth:`LoopSteps.seed`: a loaded map's keyframes into the graph and the index;
- :meth:`LoopSteps.add`: one keyframe: its odometry edge into the pose graph
  (:class:`PoseGraph`), a search of the place index for earlier keyframes
  (:class:`PlaceIndex`), then its descriptor into the index and its JPEG into the store
  (:class:`ImageStore`); it returns the candidates to verify, best first: up to
  ``loop.candidates`` above ``loop.min_score``, less those near a pair already rejected
  (:meth:`LoopSteps.add`: a look-alike place that was refused for the previous keyframes is not
  tried again for the next ones, so it cannot take every check);
- :meth:`LoopSteps.verify`: a candidate through the :class:`Verifier`; an accepted one becomes
  a robust loop edge that the graph keeps (the trajectory is corrected) or rejects (residual
  gate); with a loaded map not yet tied to the run, accepted matches are proposals and enough
  agreeing ones tie them (``loaded_map.py``).
"""

from __future__ import annotations

import collections
from dataclasses import replace
import logging
import time
from typing import Any

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.mapping.graph.batch_solve import PoseGraphEdge
from lingbot_map_ros.engine.mapping.graph.pose_graph import PoseGraph
from lingbot_map_ros.engine.mapping.loaded_map import keyframe_graph, LoadedMap
from lingbot_map_ros.engine.mapping.loop_estimate import LoopEdgeInfo, LoopEstimate
from lingbot_map_ros.engine.mapping.places.image_store import encode_jpeg, ImageStore
from lingbot_map_ros.engine.mapping.places.place_index import PlaceCandidate, PlaceIndex
from lingbot_map_ros.engine.mapping.store.map_format import KeyframeGraph
from lingbot_map_ros.engine.mapping.verify.verification import (KeyframeRecord, Verification,
                                                                Verifier)
from lingbot_map_ros.loop_config import LoopConfig
import numpy as np

logger = logging.getLogger(__name__)

_REJECTED_KEPT = 64
"""Latest rejected pairs remembered to skip their near-duplicates (a bounded memory)."""
_MIN_STEP = 1e-3
"""Floor of an odometry edge's translation standard deviation (pose units): a still camera's
zero step must not become an infinitely certain edge."""


class LoopSteps:
    """The graph, the place index, the image store and the records of one loop closer."""

    def __init__(self, verifier: Verifier, config: LoopConfig, estimate: LoopEstimate, *,
                 scale_fixed: bool, use_faiss: bool, loaded: LoadedMap | None) -> None:
        """Build the graph, the index and the store (the arguments: ``LoopCloser``).

        Raises:
            ImportError: gtsam is not installed.
        """
        self._map = loaded
        self._offset = loaded.num_keyframes if loaded is not None else 0
        self._verifier = verifier
        self._config = config
        self._estimate = estimate
        self._graph = PoseGraph(scale_fixed=scale_fixed, max_residual=config.max_residual)
        self._index = PlaceIndex(use_faiss=use_faiss)
        self._images = ImageStore(config.image_store_bytes, config.image_folder or None)
        self._records: dict[int, KeyframeRecord] = {}
        self._rejected: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=_REJECTED_KEPT)
        """(query, candidate) of the latest pairs refused by the verifier or the graph."""

    @property
    def descriptor_dim(self) -> int | None:
        """Return the place index's descriptor length, None before the first one."""
        return self._index.dim

    def stamps(self, count: int) -> np.ndarray:
        """int64 [count] image stamps of keyframes 0..count-1."""
        return np.array([self._records[n].stamp_ns for n in range(count)], np.int64)

    def stats(self) -> dict[str, Any]:
        """Return the map mode, the loaded map's keyframes, the index backend, the images."""
        return {'map_mode': self._map.mode if self._map is not None else 'mapping',
                'map_keyframes': self._offset,
                'map_matches': (0 if self._map is None else
                                self._map.min_matches if self._map.tied else
                                self._map.best_agreement),
                'index_backend': self._index.backend,
                'images_stored': len(self._images), 'image_bytes': self._images.num_bytes,
                **{f'graph_{k}': v for k, v in self._graph.stats().items()
                   if k in ('recoveries', 'loops_removed', 'loops_adopted', 'imu_factors')}}

    def close(self) -> None:
        """Drop the stored images (a folder store removes its files)."""
        self._images.clear()

    def lookup(self, index: int) -> KeyframeRecord | None:
        """Keyframe ``index``'s record with its stored image (None when unknown).

        For the verifier's neighbours, on the worker thread.
        """
        record = self._records.get(index)
        return None if record is None else replace(record, image=self.image(index))

    def image(self, index: int) -> bytes | None:
        """Return keyframe ``index``'s stored JPEG (the loaded map's or this run's), or None."""
        if index < self._offset:
            return self._map.images.get(index)
        return self._images.get(index)

    def snapshot(self) -> KeyframeGraph:
        """Return the keyframes and graph to save (``LoopCloser.snapshot``).

        Raises:
            RuntimeError: the loaded map could not be seeded.
        """
        if self._estimate.map_state == 'failed':
            raise RuntimeError('the loaded map could not be seeded (see the log)')
        if self._map is not None and self._map.mode == 'localization':
            return self._map.graph
        count = self._graph.num_nodes
        images = {n: image for n in range(count) if (image := self.image(n)) is not None}
        return keyframe_graph(self._graph.poses(), self._graph.edges(),
                              [self._records[n] for n in range(count)], images)

    def seed(self) -> None:
        """Put the loaded map's keyframes into the graph and the index (failures counted)."""
        poses = []
        try:
            self._records.update(self._map.seed(self._graph, self._index))
            poses = list(self._graph.poses())
        except Exception:  # noqa: BLE001 - a seed that fails is reported, the worker runs on
            logger.exception('loop closure: the loaded map could not be seeded')
            self._estimate.seed_failed()
        self._estimate.seeded(poses)
        if not poses:
            return
        logger.info('loaded map seeded: %d keyframes, %d edges, mode %s', len(poses),
                    len(self._graph.edges()), self._map.mode)

    def _propose(self, query: KeyframeRecord, candidate: KeyframeRecord,
                 result: Verification, found: PlaceCandidate) -> None:
        """Keep an accepted match with the loaded map; tie the run once enough agree."""
        group = self._map.propose(self._graph, query, candidate, result, found.score)
        if not group:
            logger.info('map match %d -> %d kept (%d of %d agreeing so far)', query.index,
                        candidate.index, self._map.best_agreement, self._map.min_matches)
            return
        others = [m for m in self._map.proposals if all(m is not g for g in group)]
        start = time.perf_counter()
        outcomes = self._map.join(self._graph, self._index, group, self._odometry_information)
        elapsed_ms = 1e3 * (time.perf_counter() - start)
        poses = list(self._graph.poses())
        last = len(poses) - 1
        self._estimate.correct(poses, last, self._records[last].odom_pose,
                               self._graph.covariance(last), elapsed_ms, map_state='localized')
        for match in others:  # proposals that disagree with the tie: wrong matches
            self._record(LoopEdgeInfo(match.query.index, match.candidate.index, False,
                                      'inconsistent', match.score, float('nan')),
                         'rejected_graph')
        for match, outcome in zip(group, outcomes):
            verdict = 'ok' if outcome.accepted else outcome.reason
            self._record(LoopEdgeInfo(match.query.index, match.candidate.index,
                                      outcome.accepted, verdict, match.score, outcome.residual),
                         'accepted' if outcome.accepted else 'rejected_graph')
        logger.info('localized in the loaded map: %d agreeing matches, the newest keyframe %d '
                    'with map keyframe %d (score %.3f); %d disagreeing dropped', len(group),
                    query.index, candidate.index, found.score, len(others))

    def add(self, record: KeyframeRecord, rgb: np.ndarray | None,
            rotation: tuple[np.ndarray, np.ndarray] | None = None
            ) -> list[tuple[KeyframeRecord, PlaceCandidate]]:
        """Graph node, retrieval, index, image store for one keyframe.

        ``rotation``: the IMU's from the previous keyframe, a rotation factor beside the
        odometry edge when both keyframes are this run's (none while searching a map).

        Returns:
            (the keyframe, a candidate) to verify, best candidate first: the
            ``loop.candidates`` best above ``loop.min_score``, chosen among the keyframes that
            are not within ``loop.separation`` of a candidate already rejected for a query
            within ``loop.separation`` of this one (those are counted ``skipped``).
        """
        n = record.index
        if self._estimate.map_state == 'failed':  # no graph to put it in (counted, see the log)
            self._estimate.count('errors')
            return []
        untied = self._map is not None and not self._map.tied
        map_only = self._map is not None and self._map.map_only
        if untied:
            self._map.untied.append(replace(record, image=None))
        elif n == 0:
            self._graph.add_node(record.odom_pose)
        else:
            previous = self._records[n - 1]
            measured = sim3.inverse(previous.odom_pose) @ record.odom_pose
            live = rotation is not None and n - 1 >= self._offset
            self._graph.add_node(record.odom_pose, PoseGraphEdge(
                n - 1, n, measured, self._odometry_information(measured), 'odometry'),
                rotation if live else None)
        cfg = self._config
        skipped: list[int] = []

        def skip(candidate: int) -> bool:
            if self._near_rejected(n, candidate):
                skipped.append(candidate)
                return True
            return False
        found = self._index.search(record.descriptor, n, k=cfg.candidates,
                                   min_score=cfg.min_score,
                                   exclude_recent=0 if map_only else cfg.exclude_recent,
                                   separation=cfg.separation,
                                   skip=skip if self._rejected else None)
        if untied:
            found = self._map.near_hint(found)
        if not map_only:
            self._index.add(n, record.descriptor)
        if record.image is None and rgb is not None and self._config.image_store_bytes > 0:
            record = replace(record, image=encode_jpeg(rgb))
        if record.image is not None:
            self._images.put(n, record.image)
        self._records[n] = replace(record, image=None)
        if untied:  # no graph node yet: searching the map
            corrected, covariance = None, None
        else:
            corrected, covariance = self._graph.pose(n), self._graph.covariance(n)
        self._estimate.add_keyframe(corrected, covariance, record.odom_pose, len(found))
        if skipped:
            self._estimate.count('skipped', len(skipped))
        return [(self._records[n], c) for c in found]

    def _near_rejected(self, query: int, candidate: int) -> bool:
        """Return whether (query, candidate) is a near-duplicate of a rejected pair."""
        near = self._config.separation
        return any(abs(query - q) <= near and abs(candidate - c) <= near
                   for q, c in self._rejected)

    def _odometry_information(self, measured: np.ndarray) -> np.ndarray:
        cfg = self._config
        step = float(np.linalg.norm(measured[:3, 3]))
        sigma_t = max(cfg.odometry_translation_sigma * step, _MIN_STEP)
        sigmas = [sigma_t] * 3 + [cfg.odometry_rotation_sigma] * 3 + [cfg.odometry_scale_sigma]
        return np.diag(1.0 / np.square(sigmas))

    def verify(self, query: KeyframeRecord, found: PlaceCandidate) -> bool:
        """Verify one candidate and put an accepted one into the graph.

        Returns:
            Whether the pair was accepted (the query's other candidates need no check).
        """
        candidate = self._records[found.index]
        try:
            result = self._verifier.verify(replace(query, image=self.image(query.index)),
                                           replace(candidate,
                                                   image=self.image(candidate.index)))
            if not isinstance(result, Verification):
                raise TypeError(f'verify() returned {type(result).__name__}')
        except Exception as exc:  # noqa: BLE001 - a verifier's failure is counted, not raised
            logger.warning('loop verification %d -> %d failed: %s', query.index,
                           candidate.index, exc)
            self._estimate.count('verification_errors')
            return False
        self._estimate.count('verified')
        if not result.accepted:
            self._record(LoopEdgeInfo(query.index, candidate.index, False, result.reason,
                                      found.score, float('nan')), 'rejected_verification')
            return False
        if self._map is not None and not self._map.tied:
            self._propose(query, candidate, result, found)
            return True
        edge = PoseGraphEdge(candidate.index, query.index, result.relative, result.information,
                             'loop')
        last = self._graph.num_nodes - 1
        before = self._graph.pose(last)
        start = time.perf_counter()
        try:
            outcome = self._graph.add_loop(edge)
        except ValueError as exc:
            logger.warning('loop %d -> %d refused by the graph: %s', query.index,
                           candidate.index, exc)
            self._estimate.count('verification_errors')
            return False
        elapsed_ms = 1e3 * (time.perf_counter() - start)
        if self._map is not None and candidate.index < self._offset and \
                self._map.judge(outcome.accepted) and self._estimate.map_state == 'localized':
            logger.warning('the tie to the loaded map is refuted: %d map matches in a row '
                           'disagree with it; searching again', self._map.disagreements)
            self._estimate.lose()
        if outcome.removed or outcome.adopted:  # re-judged: the graph changed either way
            self._estimate.rejudged([(e.j, e.i) for e in outcome.removed],
                                    [(e.j, e.i) for e in outcome.adopted])
        if not outcome.accepted:
            self._estimate.timed(elapsed_ms)
            self._record(LoopEdgeInfo(query.index, candidate.index, False, outcome.reason,
                                      found.score, outcome.residual), 'rejected_graph')
            if outcome.removed or outcome.adopted:
                self._correct(last, before, elapsed_ms)
            return False
        moved, turned = self._correct(last, before, elapsed_ms)
        self._record(LoopEdgeInfo(query.index, candidate.index, True, 'ok', found.score,
                                  outcome.residual), 'accepted')
        logger.info('loop closed: keyframe %d -> %d (score %.3f, residual %.2f), '
                    'correction %.3f m %.2f deg', query.index, candidate.index, found.score,
                    outcome.residual, moved, turned)
        return True

    def _correct(self, last: int, before: np.ndarray, elapsed_ms: float) -> tuple[float, float]:
        """Publish the graph's new estimate; return how far the newest keyframe moved, turned."""
        poses = list(self._graph.poses())
        after = poses[last]
        moved = float(np.linalg.norm(after[:3, 3] - before[:3, 3]))
        turned = np.degrees(sim3.rotation_angle(sim3.rotation_of(after) @
                                                sim3.rotation_of(before).T))
        self._estimate.correct(poses, last, self._records[last].odom_pose,
                               self._graph.covariance(last), elapsed_ms, (moved, float(turned)))
        return moved, float(turned)

    def _record(self, info: LoopEdgeInfo, count: str) -> None:
        if not info.accepted:
            self._rejected.append((info.query, info.candidate))
        self._estimate.record(info, count)
