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
"""Camera trajectories as TUM files, a PNG plot, and APE / RPE against ground truth.

TUM files are read and written by ``engine/map/tum.py`` (the node's ``~/save`` writes them too;
its names are re-exported here). The map frame is anchored at the first camera, with the axes the
node publishes (``frames.map_axes``: 'flu' = x forward, y left, z up; or 'optical'). Timestamps
are written with 9 decimals and read back to the exact nanosecond, so stamps survive a round trip.

The model's world is its first camera and its scale is arbitrary (``model_spec.md`` 6.3), so any
comparison with ground truth first fits a similarity transform (Umeyama, with scale). APE and RPE
come from ``evo`` (an optional dependency: ``pip install evo``); the plot needs only matplotlib.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lingbot_map_ros.engine.map.tum import format_stamp, read_tum, Trajectory, write_tum
import numpy as np

__all__ = ['align_sim3', 'associate', 'evaluate', 'format_stamp', 'plot', 'read_tum',
           'Trajectory', 'write_tum']

_LOG = logging.getLogger(__name__)


def associate(est: Trajectory, ref: Trajectory,
              max_diff_ns: int = 10_000_000) -> tuple[np.ndarray, np.ndarray]:
    """Pair poses by nearest stamp.

    Args:
        est: estimated trajectory.
        ref: reference trajectory (stamps sorted ascending).
        max_diff_ns: largest accepted stamp difference.

    Returns:
        ``(est indices, ref indices)`` of the matched pairs.
    """
    if len(ref.stamps_ns) == 0 or len(est.stamps_ns) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    right = np.clip(np.searchsorted(ref.stamps_ns, est.stamps_ns), 1, len(ref.stamps_ns) - 1)
    left = right - 1
    pick = np.where(np.abs(ref.stamps_ns[left] - est.stamps_ns)
                    <= np.abs(ref.stamps_ns[right] - est.stamps_ns), left, right)
    if len(ref.stamps_ns) == 1:
        pick = np.zeros_like(pick)
    ok = np.abs(ref.stamps_ns[pick] - est.stamps_ns) <= max_diff_ns
    return np.nonzero(ok)[0], pick[ok]


def align_sim3(src: np.ndarray, dst: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Fit the least-squares similarity ``dst ~ s * R @ src + t`` (Umeyama 1991).

    Args:
        src: [N, 3] points to move (N >= 3, not all collinear for a unique rotation).
        dst: [N, 3] target points.

    Returns:
        ``(s, R [3, 3], t [3])``.
    """
    mu_src, mu_dst = src.mean(axis=0), dst.mean(axis=0)
    a, b = src - mu_src, dst - mu_dst
    cov = b.T @ a / len(src)
    u, d, vt = np.linalg.svd(cov)
    sign = np.eye(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[2, 2] = -1.0
    rotation = u @ sign @ vt
    var_src = (a * a).sum() / len(src)
    scale = float(np.trace(np.diag(d) @ sign) / var_src) if var_src > 0 else 1.0
    return scale, rotation, mu_dst - scale * rotation @ mu_src


def evaluate(est_path: str | Path, ref_path: str | Path) -> dict[str, Any] | None:
    """Compute APE and RPE (translation, after a Sim(3) alignment) with ``evo``.

    Args:
        est_path: estimated TUM file.
        ref_path: ground-truth TUM file.

    Returns:
        ``{'num_pairs', 'scale', 'ape_m': {rmse, mean, median, max}, 'rpe_m': {...}}`` in
        ground-truth units, or None when ``evo`` is not installed.

    Raises:
        ValueError: fewer than 3 poses could be associated by stamp.
    """
    try:
        from evo.core import metrics, sync
        from evo.tools import file_interface
    except ImportError:
        _LOG.warning('evo is not installed: skipping APE/RPE (pip install evo)')
        return None
    ref = file_interface.read_tum_trajectory_file(str(ref_path))
    est = file_interface.read_tum_trajectory_file(str(est_path))
    ref, est = sync.associate_trajectories(ref, est, max_diff=0.01)
    if est.num_poses < 3:
        raise ValueError(f'only {est.num_poses} poses of {est_path} match {ref_path} by stamp')
    _, _, scale = est.align(ref, correct_scale=True)
    result: dict[str, Any] = {'num_pairs': int(est.num_poses), 'scale': float(scale)}
    for name, metric in (('ape_m', metrics.APE(metrics.PoseRelation.translation_part)),
                         ('rpe_m', metrics.RPE(metrics.PoseRelation.translation_part, delta=1,
                                               delta_unit=metrics.Unit.frames))):
        metric.process_data((ref, est))
        stats = metric.get_all_statistics()
        result[name] = {k: float(stats[k]) for k in ('rmse', 'mean', 'median', 'max')}
    return result


# Horizontal plane of each map-axes convention: (axis, label) pairs for the top view.
_TOP_VIEW = {'flu': ((1, 'y (left)'), (0, 'x (forward)')),
             'optical': ((0, 'x (right)'), (2, 'z (forward)'))}


def plot(path: str | Path, est: Trajectory, ref: Trajectory | None = None,
         title: str = '', map_axes: str = 'flu') -> None:
    """Save a PNG: top view of the first camera's ground plane and positions over time.

    With ``ref`` the estimate is Sim(3)-aligned to it (matched by stamp) so both share units.

    Args:
        path: output PNG.
        est: estimated trajectory.
        ref: optional ground truth (same map axes).
        title: figure title.
        map_axes: 'flu' or 'optical', the axes of the map frame (picks the top-view plane).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    (h_axis, h_label), (v_axis, v_label) = _TOP_VIEW[map_axes]
    est_xyz, label = est.positions, 'estimate'
    if ref is not None:
        i_est, i_ref = associate(est, ref)
        if len(i_est) >= 3:
            scale, rotation, shift = align_sim3(est_xyz[i_est], ref.positions[i_ref])
            est_xyz, label = scale * est_xyz @ rotation.T + shift, 'estimate (Sim(3)-aligned)'
    fig = Figure(figsize=(11, 4.8), layout='constrained')
    FigureCanvasAgg(fig)
    top, series = fig.subplots(1, 2, width_ratios=[1.2, 1])
    top.plot(est_xyz[:, h_axis], est_xyz[:, v_axis], 'C0-', lw=2, label=label)
    if ref is not None:
        top.plot(ref.positions[:, h_axis], ref.positions[:, v_axis], 'k--', lw=1,
                 label='ground truth')
    if len(est_xyz):
        top.plot(est_xyz[0, h_axis], est_xyz[0, v_axis], 'go', label='start')
    if map_axes == 'flu':
        top.invert_xaxis()  # y points left: keep the view as seen from above
    top.set(xlabel=h_label, ylabel=v_label, title=f'top view (map axes: {map_axes})')
    top.set_aspect('equal', adjustable='datalim')
    top.legend(loc='best', fontsize=8)
    t0 = est.stamps_ns[0] if len(est.stamps_ns) else 0
    for axis, name in enumerate('xyz'):
        series.plot((est.stamps_ns - t0) / 1e9, est_xyz[:, axis], f'C{axis}-', label=name)
        if ref is not None:
            series.plot((ref.stamps_ns - t0) / 1e9, ref.positions[:, axis], f'C{axis}--',
                        lw=0.8)
    series.set(xlabel='time (s)', ylabel='position (dashed: ground truth)',
               title='position over time')
    series.legend(loc='best', fontsize=8)
    fig.suptitle(title or f'{len(est.stamps_ns)} poses')
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), dpi=110)
