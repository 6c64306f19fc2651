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
"""MappingBackend: one camera's loop closure and map reuse behind one short API.

The one owner of the place index, the verifier, its pacing, the pose graph, the loaded map and
the map store (the first three live in the :class:`~lingbot_map_ros.engine.mapping.loop_closer.
LoopCloser` it runs; the sub-folders hold the parts). The node (``ros/inference/loop_feed.py``),
the lifecycle node (the same pipeline) and the replay (``tools/replay_loop.py``) build it once
from typed configs and call:

- :meth:`observe` a keyframe (its stamp, odometry pose, place descriptor and processed image);
  :meth:`tick` after every frame (it paces the model's verification);
- the current estimate: :attr:`closer` (``map_from_odom``, corrected poses, loop edges, stats)
  and :meth:`published` (whether poses are published in ``map``);
- :meth:`load` a map folder, :meth:`localize` in it again (with a hint), :meth:`save` a map,
  :meth:`graph_snapshot` (the keyframes and graph to save), :meth:`map_status`;
- :meth:`reset` (a new odom: a new graph) and :meth:`close`.

With an IMU (:meth:`use_rotations`, an ``engine/imu/keyframe_rotation.ImuRotations``) each
keyframe after the first also gets the gyroscope's rotation from the previous keyframe, a
rotation factor beside its odometry edge (``PoseGraph.add_node``); a keyframe the IMU does not
cover is counted and goes in without one. The factors live in the graph only: a saved map keeps
the keyframes, odometry and loop edges, not the IMU factors (a loaded map's graph has none; the
live keyframes after it get theirs again).

A map load or a localization request takes effect at the next keyframe: the closer is rebuilt
from the loaded map (``loaded_map.py``) there, on the caller's thread, never under a service.
Nothing here imports ROS.
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
from pathlib import Path
import threading
from typing import Any, Callable

from lingbot_map_ros.engine.mapping.loop_closer import LoopCloser
from lingbot_map_ros.engine.mapping.store.map_format import (KeyframeGraph, MapExpectation,
                                                             MapSnapshot)
from lingbot_map_ros.engine.mapping.store.map_store import load_map, save_map
from lingbot_map_ros.engine.mapping.verify.frame_pace import FramePace
from lingbot_map_ros.engine.mapping.verify.verification import KeyframeRecord, Verifier
from lingbot_map_ros.loop_config import LoopConfig
import numpy as np

logger = logging.getLogger(__name__)

PACE_TIMEOUT_S = 0.2
"""Longest wait of a verification unit for the next frame (frames may stop coming)."""

Hint = tuple[np.ndarray, float]
"""(position [3] in the loaded map's graph frame, radius): where the first matches may be."""


@dataclass
class _MapState:
    """The loaded map and what was asked of it (under the backend's lock)."""

    snapshot: MapSnapshot | None = None
    mode: str = 'mapping'
    path: str = ''
    error: str = ''
    hint: Hint | None = None
    matches: int = 1
    restart: bool = False
    """A load or a localization request waits for the next keyframe."""
    refused: bool = False
    """A map to localize in was refused and none runs: nothing is published in map."""


MAP_KEYS = ('map_state', 'map_mode', 'map_keyframes', 'map_path', 'map_error', 'map_matches')
"""Keys of :meth:`MappingBackend.map_status` (the map's part of the ``loop`` status)."""


class MappingBackend:
    """One camera's mapping back end (module docstring)."""

    def __init__(self, config: LoopConfig, *, scale_fixed: bool = False, engine: Any = None,
                 paced: bool = True, localize_matches: int = 1) -> None:
        """Keep the settings; the closer starts at the first keyframe.

        Args:
            config: the ``loop.*`` settings.
            scale_fixed: metric scale locked (SE(3) loops).
            engine: the model engine the verifier runs on (``ModelVerifier``); None: a
                verifier must be given (:meth:`use_verifier`) before the first keyframe.
            paced: space the verification's units between frames
                (``loop.verify_unit_interval``, :meth:`tick`); False: no pacing (replay).
            localize_matches: agreeing matches that localize in a loaded map.
        """
        self.config = config
        self._scale_fixed = scale_fixed
        self._engine = engine
        self.frame_pace = FramePace(PACE_TIMEOUT_S, config.verify_unit_interval) if paced \
            else None
        """Served frames, and when the verification's next unit may run."""
        self._verifier: Verifier | None = None
        self._owns_verifier = False
        self._closer: LoopCloser | None = None
        self._next_index = 0
        self.stamps: list[int] = []
        """Stamp (ns) of each observed keyframe of this graph, by keyframe number."""
        self._lock = threading.Lock()
        self._state = _MapState(matches=int(localize_matches))
        self.rotations: Any = None
        """The IMU's keyframe rotations (``ImuRotations``), or None without an IMU."""

    def use_rotations(self, rotations: Any) -> None:
        """Constrain each new keyframe's rotation by the IMU's (an ``ImuRotations``; None: off)."""
        self.rotations = rotations

    # -- keyframes (the frame thread) -------------------------------------------------------

    @property
    def closer(self) -> LoopCloser | None:
        """Return the running LoopCloser (the estimate: poses, edges, stats), or None."""
        return self._closer

    def use_verifier(self, verifier: Verifier) -> None:
        """Verify with ``verifier`` instead of the model (before the first keyframe)."""
        self._verifier = verifier
        self._owns_verifier = False

    def tick(self) -> None:
        """Count a served frame (the verification's pacing)."""
        if self.frame_pace is not None:
            self.frame_pace.tick()

    def observe(self, stamp_ns: int, odom_pose: np.ndarray, descriptor: np.ndarray,
                rgb: np.ndarray | None = None,
                image_size_hw: tuple[int, int] | None = None) -> None:
        """Queue a keyframe (returns at once; the closer starts at the first one).

        Args:
            stamp_ns: the keyframe's image stamp.
            odom_pose: float64 [4, 4] its continuous (odometry) pose.
            descriptor: its place descriptor [D].
            rgb: uint8 [H, W, 3] processed image to store, or None.
            image_size_hw: the processed image size, checked against a loaded map's.

        Raises:
            ValueError: a malformed pose or descriptor (nothing queued), or the closer
                cannot start (a bad setting; the reason).
            ImportError: gtsam is not installed.
        """
        if self.take_restart():
            self.reset()  # a map was loaded or a localization asked for: a new closer
        elif self._closer is not None and self._closer.map_state == 'lost':
            logger.warning('localization lost (later matches refuted the tie): searching '
                           'the loaded map again')
            self.reset()  # the tie was refuted: search the map again
        self.start(image_size_hw)
        record = KeyframeRecord(index=self._next_index, stamp_ns=int(stamp_ns),
                                odom_pose=np.asarray(odom_pose, np.float64),
                                descriptor=np.asarray(descriptor, np.float32))
        rotation = None
        if self.rotations is not None and self.stamps:
            rotation = self.rotations.keyframe(self.stamps[-1] * 1e-9, int(stamp_ns) * 1e-9)
        self._closer.add_keyframe(record, rgb, rotation)
        self._next_index += 1
        self.stamps.append(int(stamp_ns))

    def start(self, image_size_hw: tuple[int, int] | None = None) -> None:
        """Start the closer now rather than at the first keyframe (its errors surface here).

        Raises:
            ImportError: gtsam is not installed.
            ValueError: the verifier cannot be built (no depth head, a bad setting).
        """
        if self._closer is None:
            self._start(image_size_hw)

    def pace(self) -> None:
        """Wait until the verification's next unit may run (its worker calls it)."""
        if self.frame_pace is not None:
            self.frame_pace()

    def reset(self) -> None:
        """Forget the run (a session reset starts a new odom, so a new graph)."""
        self._stop()
        self._next_index = 0
        self.stamps = []

    def close(self) -> None:
        """Stop the closer and the verifier."""
        self._stop()

    # -- maps -------------------------------------------------------------------------------

    def load(self, folder: str | Path, expect: MapExpectation, mode: str,
             matches: int | None = None) -> MapSnapshot:
        """Validate the map at ``folder``; it replaces the running one at the next keyframe.

        Args:
            folder: the map folder.
            expect: the running model's hash and image size.
            mode: 'mapping' or 'localization'.
            matches: agreeing matches that localize (None keeps the current setting).

        Returns:
            The loaded map.

        Raises:
            ValueError: an unknown mode.
            Exception: the loader's refusal (``MapLoadError`` or an ``OSError``): the running
                map is kept; without one, a map to localize in leaves nothing published in
                ``map`` (:meth:`published`).
        """
        if mode not in ('mapping', 'localization'):
            raise ValueError(f"map.mode={mode!r} must be 'mapping' or 'localization'")
        try:
            loaded = load_map(folder, expect)
        except Exception:
            with self._lock:
                if self._state.snapshot is None and mode == 'localization':
                    self._state.refused = True
            raise
        with self._lock:
            state = self._state
            state.snapshot, state.mode, state.path, state.error = loaded, mode, str(folder), ''
            state.hint, state.restart, state.refused = None, True, False
            if matches is not None:
                state.matches = int(matches)
        return loaded

    def localize(self, hint: Hint | None, matches: int | None = None) -> None:
        """Search the loaded map again (at the next keyframe), near ``hint`` when given.

        Raises:
            RuntimeError: no map is loaded.
        """
        with self._lock:
            if self._state.snapshot is None:
                raise RuntimeError('no map loaded (set map.load_path, call ~/load_map)')
            self._state.hint, self._state.restart, self._state.error = hint, True, ''
            if matches is not None:
                self._state.matches = int(matches)

    def refuse(self, reason: str) -> None:
        """Keep the reason of a refused map request (``map_error`` of :meth:`map_status`)."""
        with self._lock:
            self._state.error = reason

    @property
    def loaded(self) -> MapSnapshot | None:
        """Return the loaded map, or None."""
        with self._lock:
            return self._state.snapshot

    def graph_snapshot(self, timeout_s: float) -> tuple[KeyframeGraph | None, MapSnapshot | None]:
        """Return (the keyframes and graph to save, the loaded map).

        The graph is None without a running closer; in localization mode it is the loaded
        map's, unchanged.

        Raises:
            RuntimeError: the closer was closed meanwhile; TimeoutError: its worker was busy.
        """
        with self._lock:
            loaded, mode = self._state.snapshot, self._state.mode
        closer = self._closer
        if closer is None or (loaded is not None and mode == 'localization'):
            return (loaded.graph if loaded is not None else None), loaded
        try:
            return closer.snapshot(timeout_s), loaded
        except TimeoutError as exc:
            raise TimeoutError(f'the loop closer stayed busy for {timeout_s:.0f} s (a '
                               'verification); try again') from exc

    @staticmethod
    def save(folder: str | Path, snapshot: MapSnapshot) -> Path:
        """Write ``snapshot`` as the map folder ``folder`` (``map_store.save_map``)."""
        return save_map(folder, snapshot)

    def published(self) -> bool:
        """Return whether poses are published in ``map``: no map loaded, or localized in it.

        Without a map the run is its own map (True), unless a map to localize in was refused:
        then nothing is published in ``map`` (an unrelated frame would mislead).
        """
        with self._lock:
            if self._state.snapshot is None:
                return not self._state.refused
            if self._state.restart:
                return False
        closer = self._closer
        return closer is not None and closer.map_state == 'localized'

    def frame_from_graph(self, anchor: np.ndarray) -> np.ndarray:
        """ROS ``map`` from the graph's frame: the loaded map's, else the run's ``anchor``."""
        with self._lock:
            loaded = self._state.snapshot
        return anchor if loaded is None else loaded.frame_from_graph

    def map_status(self) -> dict[str, Any]:
        """Return the map's status values: state, mode, keyframes, path, error, matches."""
        with self._lock:
            state = self._state
            loaded, mode, path, error = state.snapshot, state.mode, state.path, state.error
            restart, refused, needed = state.restart, state.refused, state.matches
        closer = self._closer
        map_state, matches = ('refused' if refused else 'none'), None
        if loaded is not None:
            live = closer is not None and not restart
            map_state = closer.map_state if live else 'searching'
            matches = f"{closer.stats()['map_matches'] if live else 0}/{needed}"
        return {'map_state': map_state, 'map_mode': mode,
                'map_keyframes': loaded.graph.num_keyframes if loaded is not None else 0,
                'map_path': path if loaded is not None else '', 'map_error': error,
                'map_matches': matches}

    def take_restart(self) -> bool:
        """Return True once after a load or a localization request (the closer restarts)."""
        with self._lock:
            restart, self._state.restart = self._state.restart, False
        return restart

    # -- internals --------------------------------------------------------------------------

    def _start(self, image_size_hw: tuple[int, int] | None) -> None:
        verifier = self._verifier if self._verifier is not None else self._model_verifier()
        self._closer = LoopCloser(verifier, self.config, scale_fixed=self._scale_fixed,
                                  **self._seed(image_size_hw))

    def _seed(self, image_size_hw: tuple[int, int] | None) -> dict[str, Any]:
        """Return the LoopCloser arguments of the loaded map ({} without one).

        A map of another image size than the session's is dropped with the reason.
        """
        with self._lock:
            state = self._state
            loaded = state.snapshot
            if loaded is None:
                return {}
            if image_size_hw is not None and \
                    tuple(image_size_hw) != tuple(loaded.image_size_hw):
                state.error = (f'map {state.path} was made at image size '
                               f'{list(loaded.image_size_hw)}; this camera gives '
                               f'{list(image_size_hw)}: map dropped')
                state.snapshot = None
                state.refused = state.mode == 'localization'
                logger.error(state.error)
                return {}
            return {'seed': loaded.graph, 'mode': state.mode, 'hint': state.hint,
                    'min_matches': state.matches}

    def _model_verifier(self) -> Verifier:
        if self._engine is None:
            raise ValueError('no verifier: give one (use_verifier) or the model engine')
        from lingbot_map_ros.engine.mapping.verify.model_verifier import (ModelVerifier,
                                                                          VerifierConfig)
        cfg = self.config
        config = VerifierConfig(frames_per_side=cfg.verify_frames,
                                min_inlier_fraction=min(cfg.min_inlier_fraction, 0.999),
                                inlier_threshold=cfg.inlier_threshold,
                                scale_fixed=self._scale_fixed)
        lookup: Callable[[int], Any] = lambda i: self._closer.lookup(i)  # noqa: E731
        self._verifier = ModelVerifier(self._engine, config, lookup=lookup,
                                       pace=self.pace if self.frame_pace is not None else None)
        self._owns_verifier = True
        return self._verifier

    def _stop(self) -> None:
        if self._closer is not None:
            self._closer.close()
            self._closer = None
        if self._owns_verifier:
            self._verifier.close()
            self._verifier, self._owns_verifier = None, False
