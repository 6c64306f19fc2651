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
"""``lingbot_map_replay run --imu-topic``: the IMU of a bag against the replayed trajectory.

After a one-camera replay, the bag's ``sensor_msgs/Imu`` readings go through the node's IMU
input (``ros/inference/imu_input.py``: the same conversion and drops) and the replayed poses
(``trajectory.tum``, the stitched odometry in its map axes) through the IMU scale tracker
(``engine/imu/scale_tracker.py``), as one session. ``summary.json`` gains an ``imu`` block: the
stream (readings, rate, gaps, drops by reason), the tracker's state, scale (metres per model
unit), gravity in the map frame and biases; with ``--gt`` also the scale's error against the
ground truth's Sim(3) fit, the metric ATE (the replay scaled by the IMU's scale, then only
rotated and moved onto the ground truth: what a metric odometry would be judged by) and, with
``--imu-truth`` (``make-bag --imu`` writes it), the gravity error in degrees.

The mounting and the time offset come from ``--imu-truth`` (``imu_from_camera``,
``time_offset_s``); without it the IMU is taken to sit at the camera with the same clock.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from lingbot_map_ros.config import ImuConfig
from lingbot_map_ros.engine.imu import ImuScaleTracker, so3, TrackerConfig
from lingbot_map_ros.ros.inference.imu_input import ImuInput
from lingbot_map_ros.tools import bag_io, trajectory
from lingbot_map_ros.tools.trajectory import Trajectory
import numpy as np

_LOG = logging.getLogger(__name__)


def read_imu(reader: Any, topic: str, config: ImuConfig) -> ImuInput:
    """Return an IMU input fed with every reading of ``topic`` (bad ones counted as drops).

    Raises:
        BagError: the topic is missing or not ``sensor_msgs/Imu``.
    """
    bag_io.require_topic(reader, topic, ('sensor_msgs/msg/Imu',))
    imu = ImuInput(config, _LOG.warning)
    for raw in bag_io.read_raw(reader, [topic]):
        try:
            msg = bag_io.deserialize(raw)
        except bag_io.BadMessageError:
            imu.buffer.drop('bad_message')
            continue
        imu.put(msg)
    return imu


def _rigid_fit(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(R, t)`` of the least-squares ``dst ~ R src + t`` (no scale)."""
    mu_s, mu_d = src.mean(axis=0), dst.mean(axis=0)
    u, _, vt = np.linalg.svd((dst - mu_d).T @ (src - mu_s))
    sign = np.diag([1.0, 1.0, np.sign(np.linalg.det(u @ vt))])
    rotation = u @ sign @ vt
    return rotation, mu_d - rotation @ mu_s


def evaluate_imu(imu: ImuInput, est: Trajectory, imu_from_camera: np.ndarray,
                 gt: Trajectory | None = None, gravity_map: np.ndarray | None = None,
                 tracker: TrackerConfig = TrackerConfig()) -> dict[str, Any]:
    """Return the ``imu`` block of the summary (module docstring).

    Args:
        imu: the input holding the bag's readings.
        est: the replayed camera poses in the map frame (one continuous odometry).
        imu_from_camera: [4, 4] mounting.
        gt: ground-truth camera poses (metres), for the scale error and the metric ATE.
        gravity_map: [3] true gravity direction in the ground truth's map frame.
        tracker: the tracker's window settings.
    """
    # Offline every reading is read before the poses, so the stream's live state says nothing;
    # the alignment's own gap check keeps a silent or slow stretch out.
    scale_tracker = ImuScaleTracker(imu.window, tracker, imu_from_camera=imu_from_camera)
    for stamp, c2w in zip(est.stamps_ns, est.c2w):
        scale_tracker.add_keyframe(stamp * 1e-9, c2w)
    stats = scale_tracker.stats()
    stream = imu.status()
    block: dict[str, Any] = {
        'topic': stream['topic'], 'readings': stream['received'],
        'accepted': stream['accepted'], 'rate_hz': round(stream['rate_hz'], 3),
        'largest_gap_s': stream['largest_gap_s'], 'drops': stream['drops'],
        'time_offset_s': stream['time_offset_s'], 'state': stats.state, 'scale': stats.scale,
        'scale_rel_std': stats.scale_rel_std, 'windows': stats.windows,
        'samples': stats.samples, 'reason': stats.reason,
        'gravity_map': None if stats.gravity is None else stats.gravity.tolist(),
        'gyro_bias': None if stats.gyro_bias is None else stats.gyro_bias.tolist(),
        'accel_bias': None if stats.accel_bias is None else stats.accel_bias.tolist()}
    if gt is None or stats.scale is None:
        return block
    est_idx, gt_idx = trajectory.associate(est, gt)
    if est_idx.size < 3:
        block['evaluation_error'] = 'fewer than 3 poses match the ground truth by stamp'
        return block
    est_p = est.c2w[est_idx, :3, 3]
    gt_p = gt.c2w[gt_idx, :3, 3]
    true_scale, _, _ = trajectory.align_sim3(est_p, gt_p)
    rotation, shift = _rigid_fit(stats.scale * est_p, gt_p)
    error = gt_p - (stats.scale * est_p @ rotation.T + shift)
    block['true_scale'] = true_scale
    block['scale_error'] = stats.scale / true_scale - 1.0
    block['metric_ate_m'] = float(np.sqrt(np.mean(np.sum(error ** 2, axis=1))))
    if gravity_map is not None:
        block['gravity_error_deg'] = float(np.degrees(so3.angle_between(
            rotation @ stats.gravity, np.asarray(gravity_map, dtype=np.float64))))
    return block


def mounting(truth: dict[str, Any] | None) -> tuple[np.ndarray, float]:
    """Return the mounting and time offset of an ``--imu-truth`` file (identity and 0 without)."""
    if truth is None:
        return np.eye(4), 0.0
    mount = np.asarray(truth['imu_from_camera'], dtype=np.float64)
    if mount.shape != (4, 4) or not np.isfinite(mount).all():
        raise ValueError('--imu-truth: imu_from_camera must be a finite 4x4 matrix')
    return mount, float(truth.get('time_offset_s', 0.0))


def add_to_run(bag: str | Path, out: Path, imu_topic: str, truth_path: str | None,
               gt: str | None) -> dict[str, Any]:
    """Evaluate the IMU against ``out/trajectory.tum``; add the block to ``out/summary.json``.

    Raises:
        BagError: the IMU topic is missing or of another type.
        ValueError: a bad truth file, or no trajectory was written.
    """
    truth = json.loads(Path(truth_path).read_text(encoding='utf-8')) if truth_path else None
    mount, offset = mounting(truth)
    tum = out / 'trajectory.tum'
    if not tum.exists():
        raise ValueError(f'no {tum}: the replay gave no poses to align the IMU with')
    topic = imu_topic if imu_topic.startswith('/') else '/' + imu_topic
    with bag_io.open_bag(bag) as reader:
        imu = read_imu(reader, topic, ImuConfig(topic=topic, time_offset_s=offset))
    block = evaluate_imu(imu, trajectory.read_tum(tum), mount,
                         trajectory.read_tum(gt) if gt else None,
                         None if truth is None else truth.get('gravity_map'))
    summary_path = out / 'summary.json'
    summary = json.loads(summary_path.read_text(encoding='utf-8'))
    summary['imu'] = block
    summary_path.write_text(json.dumps(summary, indent=2, default=str) + '\n', encoding='utf-8')
    line = (f"IMU: {block['accepted']}/{block['readings']} readings at {block['rate_hz']} Hz, "
            f"scale {block['state']}")
    if block['scale'] is not None:
        line += f" {block['scale']:.5g} m per unit"
    if 'metric_ate_m' in block:
        line += (f", scale error {100 * block['scale_error']:+.2f} %, metric ATE "
                 f"{block['metric_ate_m']:.4f} m")
    if 'gravity_error_deg' in block:
        line += f", gravity error {block['gravity_error_deg']:.3f} deg"
    _LOG.info('%s%s', line, f" ({block['reason']})" if block['reason'] else '')
    return block
