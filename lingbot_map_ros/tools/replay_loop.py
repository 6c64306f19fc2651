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
"""Loop closure in the replay (``lingbot_map_replay run --loop-closure``): the map trajectory.

:class:`LoopReplay` feeds each keyframe's prediction to the node's mapping back end
(:class:`~lingbot_map_ros.engine.mapping.backend.MappingBackend`, the same assembly) and, unlike
the node, waits for the closer after each keyframe, so the replay stays deterministic (every
candidate is verified before the next frame). At the end every frame's pose in ``map`` is the
latest keyframe at or before it, as finally corrected, moved by the frame's odometry since that
keyframe:
``M_f = M_k @ inv(O_k) @ O_f``; :meth:`LoopReplay.keyframe_poses` gives the keyframes' own
(``tools/replay_map.py`` places the ``--ply`` map's pieces by them). A session reset (a new
``odom``) closes the graph of its segment and starts a new one. The verifier is the model's
(no pacing offline) unless one is given (tests).
"""

from __future__ import annotations

import logging
from typing import Any

from lingbot_map_ros.config import LoopConfig
from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.mapping.backend import MappingBackend
from lingbot_map_ros.engine.mapping.places.image_store import network_rgb
from lingbot_map_ros.engine.mapping.verify.verification import Verifier
from lingbot_map_ros.engine.session.prediction import FramePrediction
import numpy as np

_LOG = logging.getLogger(__name__)
WAIT_S = 600.0
"""Longest wait for the closer after a keyframe (a verification pass on the CPU is slow)."""


class LoopReplay:
    """One replay's loop closure, segment by segment (module docstring)."""

    def __init__(self, session: Any, config: LoopConfig, *, verifier: Verifier | None = None,
                 scale_fixed: bool = False) -> None:
        """Ask the session for place descriptors and prepare the first segment's closer.

        Args:
            session: the replay's ``RolloverSession``.
            config: the ``loop.*`` settings.
            verifier: verifies candidates; None: the model's (``ModelVerifier``).
            scale_fixed: metric scale locked (SE(3) loops).

        Raises:
            ImportError: gtsam is not installed.
            ValueError: the model cannot verify (no depth head, too few scale frames).
        """
        self._session = session
        self._config = config
        if hasattr(session.session, 'place_descriptors'):
            session.session.place_descriptors = True
        self._backend = MappingBackend(config, scale_fixed=scale_fixed,
                                       engine=getattr(session.session, 'engine', None),
                                       paced=False)
        if verifier is not None:
            self._backend.use_verifier(verifier)
        self._done: list[np.ndarray] = []
        """Map poses of the frames of finished segments."""
        self._frames: list[tuple[np.ndarray, int]] = []
        """This segment's frames: (odometry c2w, latest keyframe number or -1)."""
        self._odometry_kf: list[np.ndarray] = []
        self._stats: list[dict[str, Any]] = []
        self._backend.start()

    def add(self, pred: FramePrediction) -> None:
        """Take one prediction (in output order); keyframes go to the closer and are waited for.

        Raises:
            RuntimeError: the keyframe has no place descriptor (the session cannot give one).
        """
        c2w = np.asarray(pred.c2w, np.float64)
        if pred.is_keyframe:
            descriptor = getattr(pred, 'descriptor', None)
            if descriptor is None:
                raise RuntimeError('--loop-closure: the predictions carry no place descriptor')
            index = len(self._odometry_kf)
            rgb = None
            if self._config.image_store_bytes > 0:
                rgb = network_rgb(pred.network_input)
            self._backend.observe(pred.stamp_ns, c2w, descriptor, rgb)
            self._odometry_kf.append(c2w)
            if not self._backend.closer.wait_idle(WAIT_S):
                raise RuntimeError(f'loop closure did not finish keyframe {index} in {WAIT_S} s')
        self._frames.append((c2w, len(self._odometry_kf) - 1))

    def reset(self) -> None:
        """End the segment (a session reset): its map poses are final; a new graph starts."""
        self._finish_segment()
        self._backend.start()

    @property
    def num_keyframes(self) -> int:
        """Keyframes of the current segment so far."""
        return len(self._odometry_kf)

    def keyframe_poses(self) -> np.ndarray:
        """[K, 4, 4] Sim(3) map-from-camera of the segment's keyframes, as corrected so far.

        A keyframe the graph has no node for keeps its odometry pose (as in :meth:`map_poses`).
        """
        corrected = self._closer.corrected_poses() if self._closer is not None else []
        poses = [corrected[k] if k < len(corrected) else c2w
                 for k, c2w in enumerate(self._odometry_kf)]
        return np.stack(poses) if poses else np.zeros((0, 4, 4))

    def map_poses(self) -> np.ndarray:
        """[N, 4, 4] Sim(3) map-from-camera of every frame so far (engine world axes)."""
        return np.stack(self._done + self._segment_poses()) if self._done or self._frames \
            else np.zeros((0, 4, 4))

    def summary(self) -> dict[str, Any]:
        """Return the closers' counters (one dict per segment), for ``summary.json``."""
        current = [self._public(self._closer.stats())] if self._closer is not None else []
        return {'segments': self._stats + current}

    def close(self) -> None:
        """Stop the closer and the model's verifier."""
        self._backend.close()

    @property
    def _closer(self) -> Any:
        return self._backend.closer

    def _segment_poses(self) -> list[np.ndarray]:
        if not self._frames:
            return []
        corrected = self._closer.corrected_poses() if self._closer is not None else []
        out = []
        for c2w, k in self._frames:
            if k < 0 or k >= len(corrected):
                out.append(c2w)
            else:
                out.append(corrected[k] @ sim3.inverse(self._odometry_kf[k]) @ c2w)
        return out

    def _finish_segment(self) -> None:
        self._done += self._segment_poses()
        if self._closer is not None:
            self._stats.append(self._public(self._closer.stats()))
        self._backend.reset()
        self._frames, self._odometry_kf = [], []

    @staticmethod
    def _public(stats: dict[str, Any]) -> dict[str, Any]:
        # JSON has no NaN: a value not known yet (no optimisation) is null.
        out = {k: (None if isinstance(v, float) and not np.isfinite(v) else v)
               for k, v in stats.items() if k != 'map_from_odom'}
        out['map_from_odom'] = np.asarray(stats['map_from_odom']).round(9).tolist()
        return out
