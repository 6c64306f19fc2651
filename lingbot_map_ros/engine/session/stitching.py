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
"""Sim(3) alignment of one session's poses to the continuous trajectory (session rollover).

:func:`align_sim3` takes the same N frames as camera-to-world poses in two frames, the
continuous (reference) frame and a new session's frame, and returns the similarity
``x_ref = scale * rotation @ x_ses + translation`` that maps the session into the reference.

- **Rotation** comes from the camera orientations, not from the centres: the chordal mean of
  ``R_ref_i @ R_ses_i^T`` projected onto SO(3). It is defined for any N >= 1, so a static or a
  straight-line overlap (where the centres alone leave a rotation about the line free) still
  aligns.
- **Scale and translation** are the least-squares fit of the rotated session centres to the
  reference centres. When the centres do not observe scale (N = 1, a static camera: their
  spread is at noise level) the result is ``degenerate``, the scale is ``fallback_scale`` and
  the translation still maps the mean centre onto the mean centre.

A rollover (:func:`fit_rollover`) also bounds how far the scale may move from the previous
session's: a fit that changes it by more than :data:`MAX_SCALE_CHANGE` either way is refused as
implausible (an outlier session, a broken overlap) and the previous scale is kept; the refused
value is reported (``rejected_scale``).

Pure numpy, no torch: 500 frames take well under a millisecond.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

_MIN_EXPLAINED = 0.5
"""Share of the reference centres' spread the scale fit must explain to be trusted."""
_REL_SPREAD_EPS = 1e-9
"""Centres spread below this (relative to their magnitude, plus 1) count as one point."""
MAX_SCALE_CHANGE = 10.0
"""Most a rollover may multiply or divide the scale by. Consecutive sessions see the same
overlap keyframes, so a real model's ratio stays near 1; the oracle test model draws session
scales up to e^2 (7.4x) apart, and a scene whose depth grows tenfold within one session is
rare. Beyond it a fit is an outlier and the previous scale is kept."""


@dataclass(frozen=True)
class Sim3Alignment:
    """A similarity transform from a session frame into the reference frame."""

    scale: float
    """Scale factor (> 0)."""
    rotation: np.ndarray
    """[3, 3] float64 rotation."""
    translation: np.ndarray
    """[3] float64 translation."""
    residual: float
    """RMS camera-centre error after alignment, in reference units."""
    degenerate: bool
    """The centres did not observe scale: ``scale`` is the fallback."""
    rejected_scale: float | None = None
    """A fitted scale refused as implausible (:func:`fit_rollover`); ``scale`` is the previous
    one then. None when the fit was taken."""

    @property
    def matrix(self) -> np.ndarray:
        """[4, 4] homogeneous similarity (``scale * rotation`` in the top-left block)."""
        out = np.eye(4)
        out[:3, :3] = self.scale * self.rotation
        out[:3, 3] = self.translation
        return out

    def apply(self, c2w: np.ndarray) -> np.ndarray:
        """Map session camera-to-world poses ``[..., 4, 4]`` into the reference frame.

        Rotation part ``rotation @ R``, centre ``scale * rotation @ t + translation``.

        Raises:
            ValueError: ``c2w`` is not ``[..., 4, 4]``.
        """
        c2w = np.asarray(c2w, dtype=np.float64)
        if c2w.ndim < 2 or c2w.shape[-2:] != (4, 4):
            raise ValueError(f'apply() needs poses of shape [..., 4, 4], got {c2w.shape}')
        out = np.zeros_like(c2w)
        out[..., :3, :3] = self.rotation @ c2w[..., :3, :3]
        out[..., :3, 3] = self.scale * (c2w[..., :3, 3] @ self.rotation.T) + self.translation
        out[..., 3, 3] = 1.0
        return out


def align_sim3(reference_c2w: np.ndarray, session_c2w: np.ndarray, *,
               fallback_scale: float = 1.0) -> Sim3Alignment:
    """Fit the Sim(3) that maps ``session_c2w`` onto ``reference_c2w`` (module docstring).

    Args:
        reference_c2w: ``[N, 4, 4]`` (N >= 1) poses of N frames in the reference frame.
        session_c2w: ``[N, 4, 4]`` poses of the same frames in the session's frame.
        fallback_scale: scale used when the centres cannot observe it (> 0).

    Returns:
        The alignment.

    Raises:
        ValueError: shapes differ or are not ``[N, 4, 4]``, a value is not finite, or
            ``fallback_scale`` is not a finite positive number.
    """
    ref, ses = _check_inputs(reference_c2w, session_c2w, fallback_scale)
    rotation = _mean_rotation(ref[:, :3, :3], ses[:, :3, :3])
    c_ref = ref[:, :3, 3]
    c_ses = ses[:, :3, 3] @ rotation.T
    mean_ref, mean_ses = c_ref.mean(axis=0), c_ses.mean(axis=0)
    d_ref, d_ses = c_ref - mean_ref, c_ses - mean_ses
    var_ses = float(np.sum(d_ses * d_ses))
    var_ref = float(np.sum(d_ref * d_ref))
    magnitude = 1.0 + float(np.abs(ses[:, :3, 3]).max())
    scale, degenerate = float(fallback_scale), True
    if len(ref) >= 2 and np.sqrt(var_ses / len(ref)) > _REL_SPREAD_EPS * magnitude:
        fitted = float(np.sum(d_ses * d_ref)) / var_ses
        sse = float(np.sum((fitted * d_ses - d_ref) ** 2))
        if fitted > 0 and sse <= (1.0 - _MIN_EXPLAINED) * var_ref:
            scale, degenerate = fitted, False
    return _with_centres(rotation, c_ref, c_ses, scale, degenerate)


def at_scale(anchor: tuple[Sim3Alignment, np.ndarray, np.ndarray] | None,
             scale: float) -> Sim3Alignment:
    """Return a session's mapping at a measured ``scale``.

    The anchor's fit with that scale (:func:`with_scale`) or, before a session has an anchor
    (the first one), the scale alone.
    """
    if anchor is None:
        return Sim3Alignment(scale, np.eye(3), np.zeros(3), 0.0, False)
    return with_scale(anchor[0], anchor[1], anchor[2], scale)


def with_scale(fit: Sim3Alignment, reference_c2w: np.ndarray, session_c2w: np.ndarray,
               scale: float) -> Sim3Alignment:
    """``fit`` with its scale replaced by one measured elsewhere (e.g. a depth ratio).

    Keeps the rotation, moves the translation so the mean centres still meet, and recomputes
    the residual; ``degenerate`` is False (the scale was observed).

    Raises:
        ValueError: as :func:`align_sim3`, or ``scale`` not finite and > 0.
    """
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f'scale={scale} must be a finite number > 0')
    ref, ses = _check_inputs(reference_c2w, session_c2w, 1.0)
    return _with_centres(fit.rotation, ref[:, :3, 3], ses[:, :3, 3] @ fit.rotation.T,
                         float(scale), False)


def fit_rollover(reference_c2w: np.ndarray, session_c2w: np.ndarray, previous_scale: float,
                 depths: tuple[list[np.ndarray], list[np.ndarray]] | None = None,
                 max_change: float = MAX_SCALE_CHANGE) -> Sim3Alignment:
    """Align a new session's overlap to the published poses, within a plausible scale change.

    The scale is the depth ratio when ``depths`` gives one (upstream's choice), else the
    centres' fit (:func:`align_sim3`, ``previous_scale`` when they cannot observe it). A scale
    more than ``max_change`` times larger or smaller than ``previous_scale`` is refused: the
    previous scale is kept and the refused one is ``rejected_scale``.

    Args:
        reference_c2w: ``[N, 4, 4]`` published poses of the overlap keyframes.
        session_c2w: ``[N, 4, 4]`` their poses in the new session.
        previous_scale: the scale of the previous session's alignment (1 for the first).
        depths: ``(published, new session)`` depth maps of the overlap, or None.
        max_change: largest accepted factor between the new and the previous scale (> 1).

    Raises:
        ValueError: as :func:`align_sim3`, or ``max_change`` not finite and > 1.
    """
    if not (np.isfinite(max_change) and max_change > 1):
        raise ValueError(f'max_change={max_change} must be a finite number > 1')
    fit = align_sim3(reference_c2w, session_c2w, fallback_scale=previous_scale)
    ratio = depth_ratio(*depths) if depths is not None else None
    if ratio is not None and np.isfinite(ratio) and ratio > 0:
        fit = with_scale(fit, reference_c2w, session_c2w, ratio)
    change = fit.scale / previous_scale
    if 1.0 / max_change <= change <= max_change:
        return fit
    kept = with_scale(fit, reference_c2w, session_c2w, previous_scale)
    return dataclasses.replace(kept, degenerate=fit.degenerate, rejected_scale=fit.scale)


def depth_ratio(reference_depths: list[np.ndarray], session_depths: list[np.ndarray]
                ) -> float | None:
    """Median over frames of the per-frame median ``reference / session`` depth ratio.

    Returns:
        The scale that maps session depth onto reference depth, or None when no frame has
        a valid pixel (both depths finite and > 0).
    """
    ratios = []
    for ref, ses in zip(reference_depths, session_depths):
        valid = np.isfinite(ref) & np.isfinite(ses) & (ref > 0) & (ses > 0)
        if valid.any():
            ratios.append(float(np.median(ref[valid] / ses[valid])))
    return float(np.median(ratios)) if ratios else None


def _with_centres(rotation: np.ndarray, c_ref: np.ndarray, c_ses: np.ndarray, scale: float,
                  degenerate: bool) -> Sim3Alignment:
    """Build the alignment with ``scale``: translation meeting the mean centres, residual.

    ``c_ses`` are the session centres already rotated into the reference orientation.
    """
    translation = c_ref.mean(axis=0) - scale * c_ses.mean(axis=0)
    errors = scale * c_ses + translation - c_ref
    residual = float(np.sqrt(np.mean(np.sum(errors * errors, axis=1))))
    return Sim3Alignment(scale, rotation, translation, residual, degenerate)


def _check_inputs(reference_c2w: np.ndarray, session_c2w: np.ndarray,
                  fallback_scale: float) -> tuple[np.ndarray, np.ndarray]:
    ref = np.asarray(reference_c2w, dtype=np.float64)
    ses = np.asarray(session_c2w, dtype=np.float64)
    if ref.ndim != 3 or ref.shape[1:] != (4, 4) or ref.shape[0] < 1:
        raise ValueError(f'reference_c2w must be [N, 4, 4] with N >= 1, got {ref.shape}')
    if ses.shape != ref.shape:
        raise ValueError(f'session_c2w has shape {ses.shape}, reference_c2w {ref.shape}; '
                         'they must be the same frames')
    if not (np.isfinite(ref).all() and np.isfinite(ses).all()):
        raise ValueError('align_sim3: the poses contain NaN or Inf')
    if not (np.isfinite(fallback_scale) and fallback_scale > 0):
        raise ValueError(f'fallback_scale={fallback_scale} must be a finite number > 0')
    return ref, ses


def _mean_rotation(r_ref: np.ndarray, r_ses: np.ndarray) -> np.ndarray:
    """Chordal L2 mean of ``R_ref_i @ R_ses_i^T``: the SO(3) closest to their sum."""
    total = np.einsum('nij,nkj->ik', r_ref, r_ses)
    u, _, vt = np.linalg.svd(total)
    fix = np.diag([1.0, 1.0, np.sign(np.linalg.det(u @ vt)) or 1.0])
    return u @ fix @ vt
