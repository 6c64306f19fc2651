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
"""LoopCloser: keyframes in, corrected poses and ``map_from_odom`` out, off the frame thread.

The frame thread only calls non-blocking methods: :meth:`LoopCloser.add_keyframe` appends a
:class:`~lingbot_map_ros.engine.loop.verification.KeyframeRecord` to a queue, and the getters
(:meth:`~LoopCloser.map_from_odom`, :meth:`~LoopCloser.corrected_poses`,
:meth:`~LoopCloser.loop_edges`, :meth:`~LoopCloser.stats`) read a snapshot under a short lock.
One worker thread does the rest, in this order:

1. every queued keyframe: its odometry edge into the pose graph (:class:`PoseGraph`), a
   search of the place index for earlier keyframes (:class:`PlaceIndex`), then its
   descriptor into the index and its JPEG into the store (:class:`ImageStore`). The best
   candidate goes to a slot of one: a newer one replaces a waiting older one (counted
   ``replaced``), so at most one verification is pending and one runs;
2. when no keyframe waits: the slot's candidate is verified (:class:`Verifier`, e.g. the
   model's joint pass); an accepted one becomes a robust loop edge, and the graph either keeps
   it (the trajectory is corrected, ``map_from_odom`` moves) or rejects it (residual gate).

With a loaded map (``seed``, ``loaded_map.py``) the worker first puts the map's keyframes into
the graph and the index; live keyframes are numbered after them and searched against the map
until a first accepted match ties the run to it (``map_state``: ``searching``, then
``localized``). :meth:`LoopCloser.snapshot` hands a consistent copy of keyframes and graph to
another thread for ``map_store.save_map``: the worker takes it between two keyframes.

A failing verifier is logged and counted; nothing it raises reaches the frame thread. Frames:
``odom`` is the frame of the records' ``odom_pose`` (the engine's continuous world), ``map``
is the graph's; ``map_from_odom = M_n @ inv(O_n)`` at the latest keyframe n, a Sim(3).
"""

from __future__ import annotations

import collections
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, replace
import logging
import threading
import time
from typing import Any

from lingbot_map_ros.engine.loop import sim3
from lingbot_map_ros.engine.loop.image_store import encode_jpeg, ImageStore
from lingbot_map_ros.engine.loop.incremental_graph import PoseGraph
from lingbot_map_ros.engine.loop.loaded_map import keyframe_graph, LoadedMap, MapMode
from lingbot_map_ros.engine.loop.map_format import KeyframeGraph
from lingbot_map_ros.engine.loop.place_index import normalised, PlaceCandidate, PlaceIndex
from lingbot_map_ros.engine.loop.pose_graph import PoseGraphEdge
from lingbot_map_ros.engine.loop.verification import KeyframeRecord, Verification, Verifier
from lingbot_map_ros.loop_config import LoopConfig
import numpy as np

logger = logging.getLogger(__name__)

_MIN_STEP = 1e-3
"""Floor of an odometry edge's translation standard deviation (pose units): a still camera's
zero step must not become an infinitely certain edge."""


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


class LoopCloser:
    """Place recognition, verification and the pose graph on one worker thread."""

    def __init__(self, verifier: Verifier, config: LoopConfig, *, scale_fixed: bool = False,
                 use_faiss: bool = True, seed: KeyframeGraph | None = None,
                 mode: MapMode = 'mapping', hint: tuple[np.ndarray, float] | None = None
                 ) -> None:
        """Build the graph, index and store and start the worker.

        Args:
            verifier: decides candidates (called on the worker thread only).
            config: the ``loop.*`` settings.
            scale_fixed: metric scale locked: SE(3) loop edges, every keyframe keeps its scale.
            use_faiss: search with faiss where installed (False: numpy).
            seed: a loaded map to localize in or map into (``loaded_map.py``); it is put
                into the graph on the worker, before the first keyframe.
            mode: with a map, 'localization' (the map is not grown) or 'mapping'.
            hint: with a map, (position [3] in its frame, radius): the first match is
                searched among the map keyframes within the radius only.

        Raises:
            ImportError: gtsam is not installed.
            ValueError: an unknown mode, or 'localization' without a map.
        """
        if seed is None and mode != 'mapping':
            raise ValueError(f'mode {mode!r} needs a loaded map')
        self._map = LoadedMap(seed, mode, hint) if seed is not None else None
        self._offset = self._map.num_keyframes if self._map is not None else 0
        self._map_state = 'searching' if self._map is not None else 'none'
        """Read by the frame thread: set with ``map_from_odom``, under the lock."""
        self._verifier = verifier
        self._config = config
        self._graph = PoseGraph(scale_fixed=scale_fixed, max_residual=config.max_residual)
        self._index = PlaceIndex(use_faiss=use_faiss)
        self._images = ImageStore(config.image_store_bytes, config.image_folder or None)
        self._records: dict[int, KeyframeRecord] = {}
        self._cond = threading.Condition()
        self._incoming: collections.deque[tuple[KeyframeRecord, np.ndarray | None]] = \
            collections.deque()
        self._pending: tuple[KeyframeRecord, PlaceCandidate] | None = None
        self._busy = self._map is not None  # until the worker has seeded the map
        self._closed = False
        self._requests: list[Future] = []
        self._next_index = 0
        # Snapshot read by the frame thread (replaced, never mutated in place, under _cond).
        self._map_from_odom = np.eye(4)
        self._covariance = np.zeros((7, 7))
        self._corrected: list[np.ndarray] = []
        self._edges: list[LoopEdgeInfo] = []
        self._version = 0
        self._counts = collections.Counter()
        self._last_correction = (0.0, 0.0)
        self._max_correction_m = 0.0
        self._optimisation_ms = float('nan')
        self._thread = threading.Thread(target=self._run, name='loop_closer', daemon=True)
        self._thread.start()

    # -- frame thread ---------------------------------------------------------------------

    def add_keyframe(self, record: KeyframeRecord, rgb: np.ndarray | None = None) -> None:
        """Queue a keyframe (returns at once).

        Args:
            record: the keyframe (its ``image`` may be None).
            rgb: uint8 [H, W, 3] processed image to store as JPEG, encoded on the worker
                (so the caller's thread does not pay for it); ignored when ``record.image``
                is given.

        Raises:
            ValueError: the record's number is not the next one (0, 1, 2, ...), or its pose or
                descriptor is malformed; nothing is queued.
            RuntimeError: the closer was closed.
        """
        pose = sim3.check_poses(np.asarray(record.odom_pose)[None], 'odom_pose')[0]
        descriptor = normalised(record.descriptor, self._index.dim)
        with self._cond:
            if self._closed:
                raise RuntimeError('the loop closer is closed')
            if record.index != self._next_index:
                raise ValueError(f'keyframe {record.index} is not the next one '
                                 f'({self._next_index})')
            self._next_index += 1
            self._incoming.append((replace(record, index=record.index + self._offset,
                                           odom_pose=pose, descriptor=descriptor), rgb))
            self._cond.notify_all()

    def map_from_odom(self) -> np.ndarray:
        """float64 [4, 4] Sim(3) ``map <- odom`` at the latest processed keyframe."""
        with self._cond:
            return self._map_from_odom.copy()

    def latest_covariance(self) -> np.ndarray:
        """Marginal covariance [7, 7] of the latest keyframe (zeros before the first).

        Order translation, rotation, log-scale, in the keyframe's own tangent space.
        """
        with self._cond:
            return self._covariance.copy()

    def corrected_poses(self) -> np.ndarray:
        """float64 [N, 4, 4] map-from-camera of the processed keyframes 0..N-1."""
        with self._cond:
            poses = list(self._corrected)
        return np.stack(poses) if poses else np.zeros((0, 4, 4))

    def node_stamps(self) -> np.ndarray:
        """int64 [N] image stamps of the keyframes of :meth:`corrected_poses`, in its order.

        With a loaded map its keyframes come first (their stamps are from the mapping run).
        """
        with self._cond:
            count = len(self._corrected)
        return np.array([self._records[n].stamp_ns for n in range(count)], np.int64)

    def loop_edges(self) -> list[LoopEdgeInfo]:
        """Every verified pair so far, accepted and rejected."""
        with self._cond:
            return list(self._edges)

    def lookup(self, index: int) -> KeyframeRecord | None:
        """Keyframe ``index``'s record with its stored image (None when unknown).

        For the verifier's neighbours: call it on the worker thread (from ``verify``).
        """
        record = self._records.get(index)
        return None if record is None else replace(record, image=self._image(index))

    @property
    def version(self) -> int:
        """Increases with every correction (a loop kept in the graph)."""
        with self._cond:
            return self._version

    def stats(self) -> dict[str, Any]:
        """Counters and the last correction (the same keys in every state)."""
        with self._cond:
            counts = dict(self._counts)
            stats = {
                'keyframes': len(self._corrected),
                'queued': len(self._incoming),
                'candidates': counts.get('candidates', 0),
                'replaced': counts.get('replaced', 0),
                'verified': counts.get('verified', 0),
                'accepted': counts.get('accepted', 0),
                'rejected_verification': counts.get('rejected_verification', 0),
                'rejected_graph': counts.get('rejected_graph', 0),
                'verification_errors': counts.get('verification_errors', 0),
                'errors': counts.get('errors', 0),
                'last_correction_m': self._last_correction[0],
                'last_correction_deg': self._last_correction[1],
                'max_correction_m': self._max_correction_m,
                'optimisation_ms': self._optimisation_ms,
                'map_from_odom': self._map_from_odom.copy(),
            }
            stats['map_state'] = self._map_state
        stats['map_mode'] = self._map.mode if self._map is not None else 'mapping'
        stats['map_keyframes'] = self._offset
        stats['index_backend'] = self._index.backend
        stats['images_stored'] = len(self._images)
        stats['image_bytes'] = self._images.num_bytes
        return stats

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every queued keyframe and the pending candidate are done (replay, tests).

        Returns:
            False when ``timeout_s`` passed first.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._incoming or self._pending is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker (a verification in progress is finished first, up to the timeout)."""
        with self._cond:
            self._closed = True
            waiting, self._requests = self._requests, []
            self._cond.notify_all()
        for future in waiting:  # snapshot() callers get a RuntimeError
            future.cancel()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._images.clear()

    # -- the map (map_store.py, loaded_map.py) ----------------------------------------------

    @property
    def map_state(self) -> str:
        """'none' (no map loaded), 'searching' (not yet tied to it) or 'localized'."""
        with self._cond:
            return self._map_state

    def snapshot(self, timeout_s: float = 60.0) -> KeyframeGraph:
        """Return a consistent copy of the keyframes and graph, to save (not on the worker).

        The worker takes it between two keyframes (the frame thread's ``add_keyframe`` never
        waits for it). In localization mode it is the loaded map, unchanged; in mapping mode
        every keyframe in the graph (a live run not yet tied to a loaded map is left out).

        Raises:
            RuntimeError: the closer is (or was meanwhile) closed.
            TimeoutError: the worker did not get to it within ``timeout_s``.
        """
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError('the loop closer is closed')
            self._requests.append(future)
            self._cond.notify_all()
        try:
            return future.result(timeout_s)
        except CancelledError as exc:
            raise RuntimeError('the loop closer was closed before the snapshot') from exc

    def _image(self, index: int) -> bytes | None:
        if index < self._offset:
            return self._map.images.get(index)
        return self._images.get(index)

    def _take_snapshot(self) -> KeyframeGraph:
        if self._map_state == 'failed':
            raise RuntimeError('the loaded map could not be seeded (see the log)')
        if self._map is not None and self._map.mode == 'localization':
            return self._map.graph
        count = self._graph.num_nodes
        images = {n: image for n in range(count) if (image := self._image(n)) is not None}
        return keyframe_graph(self._graph.poses(), self._graph.edges(),
                              [self._records[n] for n in range(count)], images)

    def _seed(self) -> None:
        poses = []
        try:
            self._records.update(self._map.seed(self._graph, self._index))
            poses = list(self._graph.poses())
        except Exception:  # noqa: BLE001 - a seed that fails is reported, the worker runs on
            logger.exception('loop closure: the loaded map could not be seeded')
            with self._cond:
                self._counts['errors'] += 1
                self._map_state = 'failed'
        with self._cond:
            self._corrected = poses
            self._busy = False
            self._cond.notify_all()
        if not poses:
            return
        logger.info('loaded map seeded: %d keyframes, %d edges, mode %s', len(poses),
                    len(self._graph.edges()), self._map.mode)

    def _tie(self, query: KeyframeRecord, candidate: KeyframeRecord, result: Verification,
             found: PlaceCandidate) -> None:
        """Join the live run to the map's graph by the first accepted match (worker)."""
        start = time.perf_counter()
        outcome = self._map.join(self._graph, self._index, query, candidate, result,
                                 self._odometry_information)
        elapsed_ms = 1e3 * (time.perf_counter() - start)
        poses = list(self._graph.poses())
        last = len(poses) - 1
        covariance = self._graph.covariance(last)
        with self._cond:
            self._covariance = covariance
            self._corrected = poses
            self._map_from_odom = poses[last] @ sim3.inverse(self._records[last].odom_pose)
            self._optimisation_ms = elapsed_ms
            self._version += 1
            self._map_state = 'localized'
        self._record(LoopEdgeInfo(query.index, candidate.index, True, 'ok', found.score,
                                  outcome.residual), 'accepted')
        logger.info('localized in the loaded map: keyframe %d matches map keyframe %d '
                    '(score %.3f)', query.index, candidate.index, found.score)

    # -- worker thread --------------------------------------------------------------------

    def _run(self) -> None:
        if self._map is not None:
            self._seed()
        while True:
            with self._cond:
                while not (self._closed or self._incoming or self._pending is not None
                           or self._requests):
                    self._cond.wait()
                if self._closed:
                    return
                batch = list(self._incoming)
                self._incoming.clear()
                job = self._pending if not batch else None
                if job is not None:
                    self._pending = None
                requests, self._requests = self._requests, []
                self._busy = True
            try:
                for record, rgb in batch:
                    self._add(record, rgb)
                for future in requests:
                    _answer(future, self._take_snapshot)
                if job is not None:
                    self._verify(*job)
            except Exception:  # noqa: BLE001 - the worker must outlive any one failure
                logger.exception('loop closure: unexpected error (counted, continuing)')
                with self._cond:
                    self._counts['errors'] += 1
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _add(self, record: KeyframeRecord, rgb: np.ndarray | None) -> None:
        """Graph node, retrieval, index, image store for one keyframe (worker)."""
        n = record.index
        if self._map_state == 'failed':  # no graph to put it in (counted, see the log)
            with self._cond:
                self._counts['errors'] += 1
            return
        untied = self._map is not None and not self._map.tied
        map_only = self._map is not None and self._map.map_only
        if untied:
            self._map.untied.append(replace(record, image=None))
        elif n == 0:
            self._graph.add_node(record.odom_pose)
        else:
            previous = self._records[n - 1]
            measured = sim3.inverse(previous.odom_pose) @ record.odom_pose
            self._graph.add_node(record.odom_pose, PoseGraphEdge(
                n - 1, n, measured, self._odometry_information(measured), 'odometry'))
        cfg = self._config
        found = self._index.search(record.descriptor, n, k=cfg.candidates,
                                   min_score=cfg.min_score,
                                   exclude_recent=0 if map_only else cfg.exclude_recent,
                                   separation=cfg.separation)
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
            corrected, covariance = None, self._covariance
        else:
            corrected, covariance = self._graph.pose(n), self._graph.covariance(n)
        with self._cond:
            self._covariance = covariance
            if corrected is not None:
                self._corrected.append(corrected)
                self._map_from_odom = corrected @ sim3.inverse(record.odom_pose)
            self._counts['candidates'] += len(found)
            if found:
                if self._pending is not None:
                    self._counts['replaced'] += 1
                self._pending = (self._records[n], found[0])

    def _odometry_information(self, measured: np.ndarray) -> np.ndarray:
        cfg = self._config
        step = float(np.linalg.norm(measured[:3, 3]))
        sigma_t = max(cfg.odometry_translation_sigma * step, _MIN_STEP)
        sigmas = [sigma_t] * 3 + [cfg.odometry_rotation_sigma] * 3 + [cfg.odometry_scale_sigma]
        return np.diag(1.0 / np.square(sigmas))

    def _verify(self, query: KeyframeRecord, found: PlaceCandidate) -> None:
        """Verify one candidate and put an accepted one into the graph (worker)."""
        candidate = self._records[found.index]
        try:
            result = self._verifier.verify(replace(query, image=self._image(query.index)),
                                           replace(candidate,
                                                   image=self._image(candidate.index)))
            if not isinstance(result, Verification):
                raise TypeError(f'verify() returned {type(result).__name__}')
        except Exception as exc:  # noqa: BLE001 - a verifier's failure is counted, not raised
            logger.warning('loop verification %d -> %d failed: %s', query.index,
                           candidate.index, exc)
            with self._cond:
                self._counts['verification_errors'] += 1
            return
        with self._cond:
            self._counts['verified'] += 1
        if not result.accepted:
            self._record(LoopEdgeInfo(query.index, candidate.index, False, result.reason,
                                      found.score, float('nan')), 'rejected_verification')
            return
        if self._map is not None and not self._map.tied:
            self._tie(query, candidate, result, found)
            return
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
            with self._cond:
                self._counts['verification_errors'] += 1
            return
        elapsed_ms = 1e3 * (time.perf_counter() - start)
        if not outcome.accepted:
            with self._cond:
                self._optimisation_ms = elapsed_ms
            self._record(LoopEdgeInfo(query.index, candidate.index, False, 'residual',
                                      found.score, outcome.residual), 'rejected_graph')
            return
        poses = list(self._graph.poses())
        after = poses[last]
        moved = float(np.linalg.norm(after[:3, 3] - before[:3, 3]))
        turned = np.degrees(sim3.rotation_angle(sim3.rotation_of(after) @
                                                sim3.rotation_of(before).T))
        covariance = self._graph.covariance(last)
        with self._cond:
            self._covariance = covariance
            self._corrected = poses
            self._map_from_odom = after @ sim3.inverse(self._records[last].odom_pose)
            self._last_correction = (moved, float(turned))
            self._max_correction_m = max(self._max_correction_m, moved)
            self._optimisation_ms = elapsed_ms
            self._version += 1
        self._record(LoopEdgeInfo(query.index, candidate.index, True, 'ok', found.score,
                                  outcome.residual), 'accepted')
        logger.info('loop closed: keyframe %d -> %d (score %.3f, residual %.2f), '
                    'correction %.3f m %.2f deg', query.index, candidate.index, found.score,
                    outcome.residual, moved, turned)

    def _record(self, info: LoopEdgeInfo, count: str) -> None:
        with self._cond:
            self._edges.append(info)
            self._counts[count] += 1


def _answer(future: Future, make: Any) -> None:
    """Set ``future`` to ``make()`` or to what it raised (unless the caller gave up)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(make())
    except Exception as exc:  # noqa: BLE001 - handed to the waiting caller
        future.set_exception(exc)
