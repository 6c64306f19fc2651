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
"""Several cameras on one rigid base: alignment of their trajectories, one odometry, failover.

Each camera runs its own session, so each has its own ``odom`` (anchored at its first pose)
and its own scale. All of them observe one rigid body, so camera ``i``'s base trajectory
``T_i(t)`` (``base_frame`` in its odom, through its mounting) is the primary camera's
``T_p(t)`` seen through a similarity. :class:`CameraRig` keeps the recent base poses of every
camera and fits, per camera, the Sim(3) ``S_i`` with ``S_i T_i(t) ~ T_p(t)``
(:func:`~lingbot_map_ros.engine.session.stitching.align_sim3`) on their common stamps (stamps
within the sync tolerance), so ``A_i(t) = S_i T_i(t)`` is camera ``i``'s base pose in the primary's
odom, the node's one ``odom``. Before any common stamp ``S_i`` is the identity (cameras that
start together anchor their odoms at the same base pose, only the scale differs).

**One odometry.** ``odom -> base_frame`` follows one camera, the *source*: the first camera, in
priority order (the primary, then the others as listed), that is live, i.e. had a posed frame
within ``stale_after_s`` (a camera with no pose yet counts as live for the first
``stale_after_s`` after the rig's first pose). The fused pose is ``K_s A_s(t)``, with ``K``
the identity for the primary as long as it is the source. **Failover:** when the source
changes from ``a`` to ``b``, ``K_b = K_a A_a(t*) A_b(t*)^-1`` at their latest common stamp
``t*``, so the fused trajectory continues from where ``a`` left it with ``b``'s motion since
``t*``: no jump beyond the alignment's residual. Without a common stamp, ``K_b = K_a``.

**Stamps only go forward.** The fused output carries the stamp of the source's frame, and TF
consumers refuse a repeated or older stamp, so a fused pose whose stamp is not newer than the
last fused one is not given out (``fused`` None, counted in :attr:`CameraRig.not_newer`). That
happens when the source switches: the primary comes back with a frame at a stamp another
camera's frame already gave, or with stamps older than the other camera's last. The primary's
reset (a new odom, e.g. a clock jump back) starts the stamps again.

Pure numpy, no ROS.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

from lingbot_map_ros.engine.session.stitching import align_sim3, Sim3Alignment
import numpy as np

HISTORY = 600
"""Base poses kept per camera for the alignment (20 s at 30 Hz)."""


@dataclasses.dataclass(frozen=True)
class RigUpdate:
    """What one camera's pose gives the rig's outputs."""

    aligned: np.ndarray
    """[4, 4] the camera's base pose in the node's odom (``A_i(t)``)."""
    fused: np.ndarray | None
    """[4, 4] the node's ``odom -> base_frame`` at this stamp; None unless this camera is the
    source."""
    switched_from: str | None
    """The previous source when this frame made this camera the source, else None."""
    not_newer: bool = False
    """This camera is the source but its stamp is not newer than the last fused one: ``fused``
    is None (module docstring)."""


@dataclasses.dataclass(frozen=True)
class CameraState:
    """One camera's alignment, for diagnostics."""

    name: str
    scale: float
    """Scale of ``S_i`` (1 for the primary, and before a fit)."""
    residual: float
    """RMS base-position error of the fit, in odom units (0 before a fit)."""
    matched: int
    """Common stamps of the last fit."""
    degenerate: bool
    """The last fit could not observe the scale (too few or too close positions)."""
    live: bool
    frames: int
    """Poses received since start."""


class _Camera:
    def __init__(self, name: str, history: int) -> None:
        self.name = name
        self.stamps: collections.deque[int] = collections.deque(maxlen=history)
        self.poses: collections.deque[np.ndarray] = collections.deque(maxlen=history)
        self.fit: Sim3Alignment | None = None
        self.matched = 0
        self.fitted_until: int | None = None
        self.last_seen_s: float | None = None
        self.frames = 0

    def clear(self) -> None:
        self.stamps.clear()
        self.poses.clear()
        self.fit, self.matched = None, 0

    def aligned(self, pose: np.ndarray) -> np.ndarray:
        return pose if self.fit is None else self.fit.apply(pose)


class CameraRig:
    """Aligns the cameras' base trajectories, picks the source, fuses one odometry."""

    def __init__(self, names: Sequence[str], primary: str, sync_tolerance_ns: int,
                 stale_after_s: float, history: int = HISTORY) -> None:
        """Start with no poses.

        Args:
            names: the cameras, in the priority order after the primary.
            primary: the camera whose odom is the node's (one of ``names``).
            sync_tolerance_ns: stamps at most this far apart are one instant (>= 0).
            stale_after_s: a camera without a pose for longer is not live (> 0).
            history: base poses kept per camera (>= 2).

        Raises:
            ValueError: no names, duplicates, an unknown primary or a bad number.
        """
        names = list(names)
        if not names or len(set(names)) != len(names) or primary not in names:
            raise ValueError(f'CameraRig needs unique names including the primary, got '
                             f'{names} with primary {primary!r}')
        if sync_tolerance_ns < 0 or not stale_after_s > 0 or history < 2:
            raise ValueError('CameraRig: sync_tolerance_ns >= 0, stale_after_s > 0 and '
                             'history >= 2 are needed')
        self.primary = primary
        self.order = [primary] + [n for n in names if n != primary]
        self.tolerance_ns = int(sync_tolerance_ns)
        self.stale_after_s = float(stale_after_s)
        self._cams = {n: _Camera(n, history) for n in names}
        self.source = primary
        self._correction = np.eye(4)
        self.switches = 0
        self.not_newer = 0
        """Fused poses not given out since start: their stamp was not newer than the last."""
        self._last_fused_ns: int | None = None
        self._start_s: float | None = None

    def add(self, name: str, stamp_ns: int, base_pose: np.ndarray, now_s: float) -> RigUpdate:
        """Take camera ``name``'s base pose in its own odom at ``stamp_ns``, received ``now_s``.

        Raises:
            KeyError: an unknown camera.
            ValueError: a pose that is not a finite [4, 4].
        """
        pose = np.array(base_pose, dtype=np.float64)  # a copy: the history keeps it
        if pose.shape != (4, 4) or not np.isfinite(pose).all():
            raise ValueError(f'camera {name}: the base pose must be a finite [4, 4]')
        cam = self._cams[name]
        if self._start_s is None:
            self._start_s = now_s
        if cam.stamps and stamp_ns <= cam.stamps[-1]:
            cam.clear()  # a new session of this camera: its odom starts again
        cam.stamps.append(int(stamp_ns))
        cam.poses.append(pose)
        cam.last_seen_s, cam.frames = now_s, cam.frames + 1
        if name != self.primary:
            self._fit(cam)
        switched = self._pick_source(now_s)
        aligned = cam.aligned(pose)
        if name != self.source:
            return RigUpdate(aligned, None, None)
        if self._last_fused_ns is not None and stamp_ns <= self._last_fused_ns:
            self.not_newer += 1
            return RigUpdate(aligned, None, switched, not_newer=True)
        self._last_fused_ns = int(stamp_ns)
        return RigUpdate(aligned, self._correction @ aligned, switched)

    def clear(self, name: str) -> None:
        """Forget camera ``name``'s poses (its session was reset: a new odom).

        The primary's reset starts the node's odom again: every alignment is refitted.
        """
        self._cams[name].clear()
        if name == self.primary:
            for cam in self._cams.values():
                cam.clear()
            self._correction = np.eye(4)
            self.source = self.primary
            self._last_fused_ns = None

    def states(self, now_s: float) -> list[CameraState]:
        """Return every camera's alignment and liveness, in priority order."""
        out = []
        for name in self.order:
            cam = self._cams[name]
            fit = cam.fit
            out.append(CameraState(name, 1.0 if fit is None else fit.scale,
                                   0.0 if fit is None else fit.residual, cam.matched,
                                   fit is not None and fit.degenerate, self._live(cam, now_s),
                                   cam.frames))
        return out

    def similarity(self, name: str) -> np.ndarray:
        """Return ``S_i`` of camera ``name`` as a [4, 4] matrix (identity before a fit)."""
        fit = self._cams[name].fit
        return np.eye(4) if fit is None else fit.matrix

    def _live(self, cam: _Camera, now_s: float) -> bool:
        # A camera without a pose yet is live for the first stale_after_s of the rig: the
        # first frames of the cameras arrive in any order, and need not switch the source.
        seen = cam.last_seen_s if cam.last_seen_s is not None else self._start_s
        return seen is not None and now_s - seen <= self.stale_after_s

    def _matches(self, cam: _Camera) -> tuple[np.ndarray, np.ndarray]:
        """Return the indices into the primary's and ``cam``'s histories of their common stamps."""
        ref = self._cams[self.primary]
        if not ref.stamps or not cam.stamps:
            return np.zeros(0, int), np.zeros(0, int)
        return match_stamps(np.fromiter(ref.stamps, np.int64),
                            np.fromiter(cam.stamps, np.int64), self.tolerance_ns)

    def _fit(self, cam: _Camera) -> None:
        ref_idx, cam_idx = self._matches(cam)
        if len(ref_idx) == 0:
            return
        newest = self._cams[self.primary].stamps[ref_idx[-1]]
        if cam.fit is not None and newest == cam.fitted_until:
            return  # no new common stamp since the last fit
        cam.fitted_until = newest
        ref = np.stack(self._cams[self.primary].poses)[ref_idx]
        own = np.stack(cam.poses)[cam_idx]
        previous = 1.0 if cam.fit is None else cam.fit.scale
        cam.fit = align_sim3(ref, own, fallback_scale=previous)
        cam.matched = len(ref_idx)

    def _pick_source(self, now_s: float) -> str | None:
        live = [n for n in self.order if self._live(self._cams[n], now_s)]
        if not live or live[0] == self.source:
            return None
        old, new = self._cams[self.source], self._cams[live[0]]
        idx_old, idx_new = match_stamps(np.fromiter(old.stamps, np.int64),
                                        np.fromiter(new.stamps, np.int64), self.tolerance_ns)
        if len(idx_old):
            a_old = old.aligned(old.poses[idx_old[-1]])
            a_new = new.aligned(new.poses[idx_new[-1]])
            self._correction = self._correction @ a_old @ np.linalg.inv(a_new)
        previous, self.source = self.source, new.name
        self.switches += 1
        return previous


def match_stamps(a: np.ndarray, b: np.ndarray, tolerance_ns: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Pair increasing stamps ``a`` and ``b`` that are at most ``tolerance_ns`` apart.

    Each stamp of ``b`` is paired with its nearest stamp of ``a``; a stamp of ``a`` is used at
    most once (the first ``b`` to claim it).

    Returns:
        ``(indices into a, indices into b)``, increasing.
    """
    if len(a) == 0 or len(b) == 0:
        return np.zeros(0, int), np.zeros(0, int)
    right = np.clip(np.searchsorted(a, b), 0, len(a) - 1)
    left = np.clip(right - 1, 0, len(a) - 1)
    nearest = np.where(np.abs(a[left] - b) <= np.abs(a[right] - b), left, right)
    ok = np.abs(a[nearest] - b) <= tolerance_ns
    idx_a, idx_b = nearest[ok], np.nonzero(ok)[0]
    first = np.concatenate([[True], idx_a[1:] != idx_a[:-1]]) if len(idx_a) else idx_a > 0
    return idx_a[first], idx_b[first]
