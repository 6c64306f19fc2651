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
:class:`~lingbot_map_ros.engine.mapping.verify.verification.KeyframeRecord` to a queue, and the
getters (:meth:`~LoopCloser.map_from_odom`, :meth:`~LoopCloser.corrected_poses`,
:meth:`~LoopCloser.loop_edges`, :meth:`~LoopCloser.stats`) read the worker's latest estimate
(``loop_estimate.py``) under a short lock. One worker thread does the rest, in this order (the
steps themselves, single-threaded: ``loop_steps.py``):

1. every queued keyframe: its odometry edge into the pose graph, a search of the place index
   for earlier keyframes, then its descriptor into the index and its JPEG into the store. Its
   candidates (up to ``loop.candidates``, less near-duplicates of rejected pairs) join the
   waiting list, which keeps the ``loop.candidates`` best by score: a waiting older one that
   falls out is counted ``replaced``;
2. when no keyframe waits: the best waiting candidate is verified (:class:`Verifier`, e.g. the
   model's joint pass), one per turn, so the checks are spread over the following keyframes
   and one runs at a time; an accepted one becomes a robust loop edge, and the graph either
   keeps it (the trajectory is corrected, ``map_from_odom`` moves) or rejects it (residual
   gate). Once a keyframe has a loop its other waiting candidates are dropped.

With a loaded map (``seed``, ``loaded_map.py``) the worker first puts the map's keyframes into
the graph and the index; live keyframes are numbered after them and searched against the map
until ``min_matches`` agreeing matches tie the run to it (``map_state``: ``searching``, then
``localized``). :meth:`LoopCloser.snapshot` hands a consistent copy of keyframes and graph to
another thread for ``map_store.save_map``: the worker takes it between two keyframes.

A failing verifier is logged and counted; nothing it raises reaches the frame thread. Frames:
``odom`` is the frame of the records' ``odom_pose`` (the engine's continuous world), ``map``
is the graph's; ``map_from_odom = M_n @ inv(O_n)`` at the latest keyframe n, a Sim(3).
"""

from __future__ import annotations

import collections
from concurrent.futures import CancelledError, Future
from dataclasses import replace
import logging
import threading
import time
from typing import Any

from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.mapping.loaded_map import LoadedMap, MapMode
from lingbot_map_ros.engine.mapping.loop_estimate import LoopEdgeInfo, LoopEstimate
from lingbot_map_ros.engine.mapping.loop_steps import LoopSteps
from lingbot_map_ros.engine.mapping.places.place_index import normalised, PlaceCandidate
from lingbot_map_ros.engine.mapping.store.map_format import KeyframeGraph
from lingbot_map_ros.engine.mapping.verify.verification import KeyframeRecord, Verifier
from lingbot_map_ros.loop_config import LoopConfig
import numpy as np

logger = logging.getLogger(__name__)


class LoopCloser:
    """Place recognition, verification and the pose graph on one worker thread."""

    def __init__(self, verifier: Verifier, config: LoopConfig, *, scale_fixed: bool = False,
                 use_faiss: bool = True, seed: KeyframeGraph | None = None,
                 mode: MapMode = 'mapping', hint: tuple[np.ndarray, float] | None = None,
                 min_matches: int = 1) -> None:
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
            min_matches: with a map, agreeing matches that tie the run to it (``loaded_map.py``).

        Raises:
            ImportError: gtsam is not installed.
            ValueError: an unknown mode, or 'localization' without a map.
        """
        if seed is None and mode != 'mapping':
            raise ValueError(f'mode {mode!r} needs a loaded map')
        loaded = LoadedMap(seed, mode, hint, min_matches) if seed is not None else None
        self._offset = loaded.num_keyframes if loaded is not None else 0
        self._cond = threading.Condition()
        self._incoming: collections.deque[tuple[KeyframeRecord, np.ndarray | None, Any]] = \
            collections.deque()
        self._pending: list[tuple[KeyframeRecord, PlaceCandidate]] = []
        """Candidates waiting for a check, best score first (at most ``loop.candidates``)."""
        self._capacity = config.candidates
        self._busy = loaded is not None  # until the worker has seeded the map
        self._closed = False
        self._requests: list[Future] = []
        self._next_index = 0
        self._estimate = LoopEstimate(self._cond, 'searching' if loaded is not None else 'none')
        """What the frame thread reads, under ``_cond``."""
        self._steps = LoopSteps(verifier, config, self._estimate, scale_fixed=scale_fixed,
                                use_faiss=use_faiss, loaded=loaded)
        """The graph, index, store and records: the worker's only (``loop_steps.py``)."""
        self._seeding = loaded is not None
        self._thread = threading.Thread(target=self._run, name='loop_closer', daemon=True)
        self._thread.start()

    # -- frame thread ---------------------------------------------------------------------

    def add_keyframe(self, record: KeyframeRecord, rgb: np.ndarray | None = None,
                     rotation: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Queue a keyframe (returns at once).

        Args:
            record: the keyframe (its ``image`` may be None).
            rgb: uint8 [H, W, 3] processed image to store as JPEG, encoded on the worker
                (so the caller's thread does not pay for it); ignored when ``record.image``
                is given.
            rotation: the IMU's ``(R, cov)`` from the previous keyframe to this one (a
                rotation factor beside the odometry edge: ``PoseGraph.add_node``), or None.

        Raises:
            ValueError: the record's number is not the next one (0, 1, 2, ...), or its pose or
                descriptor is malformed; nothing is queued.
            RuntimeError: the closer was closed.
        """
        pose = sim3.check_poses(np.asarray(record.odom_pose)[None], 'odom_pose')[0]
        descriptor = normalised(record.descriptor, self._steps.descriptor_dim)
        with self._cond:
            if self._closed:
                raise RuntimeError('the loop closer is closed')
            if record.index != self._next_index:
                raise ValueError(f'keyframe {record.index} is not the next one '
                                 f'({self._next_index})')
            self._next_index += 1
            self._incoming.append((replace(record, index=record.index + self._offset,
                                           odom_pose=pose, descriptor=descriptor), rgb,
                                   rotation))
            self._cond.notify_all()

    def map_from_odom(self) -> np.ndarray:
        """float64 [4, 4] Sim(3) ``map <- odom`` at the latest processed keyframe."""
        return self._estimate.map_from_odom()

    def latest_covariance(self) -> np.ndarray:
        """Marginal covariance [7, 7] of the latest keyframe (zeros before the first).

        Order translation, rotation, log-scale, in the keyframe's own tangent space.
        """
        return self._estimate.covariance()

    def corrected_poses(self) -> np.ndarray:
        """float64 [N, 4, 4] map-from-camera of the processed keyframes 0..N-1."""
        return self._estimate.corrected_poses()

    def node_stamps(self) -> np.ndarray:
        """int64 [N] image stamps of the keyframes of :meth:`corrected_poses`, in its order.

        With a loaded map its keyframes come first (their stamps are from the mapping run).
        """
        return self._steps.stamps(self._estimate.num_keyframes)

    def loop_edges(self) -> list[LoopEdgeInfo]:
        """Every verified pair so far, accepted and rejected."""
        return self._estimate.loop_edges()

    def lookup(self, index: int) -> KeyframeRecord | None:
        """Keyframe ``index``'s record with its stored image (None when unknown).

        For the verifier's neighbours: call it on the worker thread (from ``verify``).
        """
        return self._steps.lookup(index)

    @property
    def version(self) -> int:
        """Increases with every correction (a loop kept in the graph)."""
        return self._estimate.version

    def stats(self) -> dict[str, Any]:
        """Counters and the last correction (the same keys in every state)."""
        with self._cond:
            stats = self._estimate.values(len(self._incoming))
        stats.update(self._steps.stats())
        return stats

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every queued keyframe and the pending candidate are done (replay, tests).

        Returns:
            False when ``timeout_s`` passed first.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._incoming or self._pending or self._busy:
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
        self._steps.close()

    # -- the map (map_store.py, loaded_map.py) ----------------------------------------------

    @property
    def map_state(self) -> str:
        """'none' (no map loaded), 'searching' (not yet tied to it) or 'localized'."""
        return self._estimate.map_state

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

    # -- worker thread --------------------------------------------------------------------

    def _run(self) -> None:
        if self._seeding:
            self._steps.seed()
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        while True:
            with self._cond:
                while not (self._closed or self._incoming or self._pending or self._requests):
                    self._cond.wait()
                if self._closed:
                    return
                batch = list(self._incoming)
                self._incoming.clear()
                job = self._pending.pop(0) if not batch and self._pending else None
                requests, self._requests = self._requests, []
                self._busy = True
            try:
                for record, rgb, rotation in batch:
                    self._add(record, rgb, rotation)
                for future in requests:
                    _answer(future, self._steps.snapshot)
                if job is not None and self._steps.verify(*job):
                    self._drop_query(job[0].index)
            except Exception:  # noqa: BLE001 - the worker must outlive any one failure
                logger.exception('loop closure: unexpected error (counted, continuing)')
                self._estimate.count('errors')
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _add(self, record: KeyframeRecord, rgb: np.ndarray | None, rotation: Any) -> None:
        """One keyframe's steps; its candidates join the waiting list (the best are kept)."""
        jobs = self._steps.add(record, rgb, rotation)
        if not jobs:
            return
        with self._cond:
            waiting = sorted(self._pending + jobs, key=lambda job: -job[1].score)
            kept = waiting[:self._capacity]
            kept_ids = {id(job) for job in kept}
            dropped = sum(1 for job in self._pending if id(job) not in kept_ids)
            if dropped:
                self._estimate.count('replaced', dropped)
            self._pending = kept

    def _drop_query(self, query: int) -> None:
        """Forget the waiting candidates of a keyframe that has its loop."""
        with self._cond:
            self._pending = [job for job in self._pending if job[0].index != query]


def _answer(future: Future, make: Any) -> None:
    """Set ``future`` to ``make()`` or to what it raised (unless the caller gave up)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(make())
    except Exception as exc:  # noqa: BLE001 - handed to the waiting caller
        future.set_exception(exc)
