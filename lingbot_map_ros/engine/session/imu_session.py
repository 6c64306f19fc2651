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
"""ImuSession: the IMU's metric scale and gravity beside the depth camera's, per rollover session.

The IMU counterpart of :class:`~.metric_session.MetricSession` in the rollover wrapper
(``engine/session/rollover.py``), at the same hooks: each batch of session predictions
(:meth:`observe`, before stitching) hands its keyframes (stamp on the camera clock, session
pose) to the :class:`~lingbot_map_ros.engine.imu.scale_tracker.ImuScaleTracker`; a rollover
(:meth:`start_session`) starts the tracker's new session on the overlap keyframes; a reset
(:meth:`reset`) forgets everything, gravity included.

**Scale.** Once the tracker has *locked* the session's scale, :meth:`alignment` maps the session
into the continuous frame with it, exactly as a locked depth scale does (the rollover's own fit
keeps its rotation, the translation moves so the overlap's mean centres still meet). A depth
camera's scale, when there is one, comes first: the IMU's is then only compared with it (the
``imu`` status's ``depth.disagreement``). Without a lock (waiting, settling, degenerate) the
rollover's own mapping is kept, so the colour path behaves as without an IMU.

**Gravity.** The tracker's gravity is in the session's world frame; :meth:`gravity_continuous`
rotates it into the continuous frame with the current mapping (the rollover's rotation);
:meth:`gravity_world` keeps each new estimate in the continuous frame of the session that gave it
(a rollover's fit rotation, kept by every mapping of the session), which is what the node's
levelling of ``map`` needs (``engine/imu/leveling.py``).

Without a tracker (no ``input.imu_topic``) every method is a no-op and :meth:`alignment` returns
its argument unchanged.
"""

from __future__ import annotations

from lingbot_map_ros.engine.imu.scale_tracker import ImuScaleTracker, ImuStats
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.engine.session.stitching import at_scale, Sim3Alignment
import numpy as np


class ImuSession:
    """Per-session IMU scale at the rollover's hooks (module docstring)."""

    def __init__(self, tracker: ImuScaleTracker | None = None) -> None:
        """Wrap ``tracker`` (None: no IMU, every hook a no-op)."""
        self._tracker = tracker
        self._anchor: tuple[Sim3Alignment, np.ndarray, np.ndarray] | None = None
        self._mapping: tuple[float, Sim3Alignment] | None = None
        self._stats = tracker.stats() if tracker is not None else ImuStats()
        self._clear_gravity()

    @property
    def enabled(self) -> bool:
        """Return True when an IMU tracker is attached."""
        return self._tracker is not None and self._tracker.enabled

    def attach(self, tracker: ImuScaleTracker | None) -> None:
        """Attach the node's tracker (before the first frame); None detaches it."""
        self._tracker = tracker
        self._anchor = None
        self._mapping = None
        self._stats = tracker.stats() if tracker is not None else ImuStats()
        self._clear_gravity()

    def stats(self) -> ImuStats:
        """Return the tracker's statistics as of the last batch (safe from any thread)."""
        return self._stats

    def scale(self) -> float | None:
        """Return the session's locked metres per model unit, None while not locked."""
        if not self.enabled or self._stats.state != 'locked':
            return None
        return self._stats.scale

    def observe(self, preds: list[FramePrediction]) -> None:
        """Hand one batch's keyframes (session poses, before stitching) to the tracker."""
        if not self.enabled or not preds:
            return
        for pred in preds:
            if pred.is_keyframe:
                self._tracker.add_keyframe(pred.stamp_ns * 1e-9, pred.c2w)
        self._stats = self._tracker.stats()
        self._note_gravity()

    def start_session(self, preds: list[FramePrediction], reference_c2w: np.ndarray,
                      session_c2w: np.ndarray, fit: Sim3Alignment) -> None:
        """Begin the session a rollover started on the overlap keyframes.

        Args:
            preds: the new session's predictions of the overlap keyframes, in order.
            reference_c2w: their published (continuous) poses.
            session_c2w: their poses in the new session.
            fit: the rollover's own alignment.
        """
        if not self.enabled:
            return
        self._tracker.start_session()
        self._anchor = (fit, reference_c2w, session_c2w)
        self._mapping = None
        # The tracker's gravity so far is the previous session's (already kept in the
        # continuous frame); its next estimate is in this session's frame.
        self._session_rotation = np.asarray(fit.rotation, dtype=np.float64)
        for pred in preds:  # the overlap keyframes, in the new session's units
            self._tracker.add_keyframe(pred.stamp_ns * 1e-9, pred.c2w)
        self._stats = self._tracker.stats()
        self._note_gravity()

    def reset(self) -> None:
        """Forget the sessions and gravity (a new origin)."""
        if not self.enabled:
            return
        self._tracker.reset()
        self._anchor = None
        self._mapping = None
        self._stats = self._tracker.stats()
        self._clear_gravity()

    def alignment(self, current: Sim3Alignment | None, depth_scale: float | None = None
                  ) -> Sim3Alignment | None:
        """Return the session -> continuous mapping: the IMU's locked scale, else ``current``.

        Args:
            current: the mapping the depth camera or the rollover's fit gives.
            depth_scale: the depth camera's scale of this session (None without one): when
                set, ``current`` is kept (the depth camera comes first).
        """
        scale = self.scale()
        if scale is None or depth_scale is not None:
            return current
        if self._mapping is None or self._mapping[0] != scale:
            self._mapping = (scale, at_scale(self._anchor, scale))
        return self._mapping[1]

    def gravity_continuous(self, current: Sim3Alignment | None) -> np.ndarray | None:
        """Return the tracker's gravity (unit, the pull) in the continuous frame, or None.

        Args:
            current: the session -> continuous mapping in use (None: the identity).
        """
        gravity = self._stats.gravity
        if gravity is None:
            return None
        rotation = np.eye(3) if current is None else current.rotation
        out = rotation @ np.asarray(gravity, dtype=np.float64)
        return out / np.linalg.norm(out)

    def gravity_world(self) -> np.ndarray | None:
        """Return the latest gravity (unit, the pull) in the continuous frame, or None.

        Each new estimate is rotated by the mapping rotation of the session that gave it, so a
        rollover does not turn an estimate of the session before.
        """
        return None if self._gravity_world is None else self._gravity_world.copy()

    def _clear_gravity(self) -> None:
        """Forget gravity (a new origin, or a tracker attached)."""
        self._session_rotation = np.eye(3)
        self._gravity_session: np.ndarray | None = None
        self._gravity_world: np.ndarray | None = None

    def _note_gravity(self) -> None:
        """Keep the tracker's gravity in the continuous frame when it is a new estimate."""
        gravity = self._stats.gravity
        if gravity is None:
            return
        gravity = np.asarray(gravity, dtype=np.float64)
        if self._gravity_session is not None and np.array_equal(gravity, self._gravity_session):
            return
        self._gravity_session = gravity.copy()
        out = self._session_rotation @ gravity
        self._gravity_world = out / np.linalg.norm(out)
