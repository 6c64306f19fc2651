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
"""``lingbot_map_replay run --imu-topic``: the bag's IMU fused during the run, as in the node.

The bag's ``sensor_msgs/Imu`` readings go through the node's IMU input
(``ros/inference/imu_input.py``: the same conversion, checks, drops and stream states) into an
:class:`~lingbot_map_ros.engine.imu.scale_tracker.ImuScaleTracker` attached to the run's
``RolloverSession`` IMU hook (``RolloverSession.imu.attach``), exactly as the node's
``ImuFusion`` does. :meth:`ReplayImu.order` hands the run each colour image only once the readings
up to its stamp are in the buffer (a bag records an IMU reading after the image of the same
instant more often than not), so every keyframe finds its readings as it would in the node. Once
a session's scale locks, the session is mapped in metres: ``trajectory.tum``, depth and the map
are metric from that pose on (the model's units before it), the same numbers the node publishes.

``summary.json`` gains an ``imu`` block: the stream (readings, rate, gaps, drops by reason,
pauses), the mounting's source, the tracker's state and scale (the last session's metres per
model unit), the first lock (stamp, seconds after the first pose, gravity in the map axes),
the locks counted and the biases. :func:`evaluate` adds, with ``--gt``, the metric ATE of the
poses from the first lock on (only rotated and moved onto the ground truth, no scale fitted:
what a metric odometry is judged by), their scale error (the Sim(3) fit's scale) and, with
``--imu-truth`` (``make-bag --imu`` writes it), the gravity error in degrees.

The mounting and the time offset come from ``--imu-truth`` (``imu_from_camera``,
``time_offset_s``), else from ``imu.imu_from_camera`` and ``imu.time_offset_s`` of the
parameter file (the identity and 0 by default).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from lingbot_map_ros.config import ImuConfig
from lingbot_map_ros.engine.imu import AlignmentOptions, ImuScaleTracker, so3
from lingbot_map_ros.ros.inference.imu_input import ImuInput
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.parameters.mounting import pose7_to_matrix
from lingbot_map_ros.tools import bag_io, strict_json, trajectory
from lingbot_map_ros.tools.trajectory import Trajectory
import numpy as np

_LOG = logging.getLogger(__name__)
IMU_TYPE = 'sensor_msgs/msg/Imu'
HOLD_S = 1.0
"""An image waits at most this long (bag time) for the readings up to its stamp: an IMU that
is late or stopped must not hold the colour path (the node does not wait either)."""


@dataclasses.dataclass(frozen=True)
class ImuRun:
    """What the offline run needs to fuse the bag's IMU (``RunOptions.imu``)."""

    config: ImuConfig
    """The ``imu.*`` settings; ``topic`` is the bag's IMU topic."""
    imu_from_camera: tuple[float, ...] = tuple(np.eye(4).ravel())
    """[4, 4] mounting, row-major (camera optical frame into the IMU frame)."""
    mounting: str = 'parameter'
    """Where the mounting came from: 'imu_truth' or 'parameter'."""

    @classmethod
    def from_values(cls, values: dict[str, Any], topic: str,
                    truth: dict[str, Any] | None = None) -> 'ImuRun':
        """Build from node-style values (``imu.*``) and an optional ``--imu-truth`` file.

        Raises:
            ValueError: a bad ``imu.*`` value or a bad truth file.
        """
        from lingbot_map_ros.ros.parameters import params

        config = params.imu_config({**values, 'input.imu_topic': topic})
        if truth is not None:
            mount, offset = mounting(truth)
            return cls(dataclasses.replace(config, time_offset_s=offset),
                       tuple(mount.ravel()), 'imu_truth')
        mount = pose7_to_matrix(config.imu_from_camera, 'imu.imu_from_camera') \
            if config.imu_from_camera else np.eye(4)
        return cls(config, tuple(mount.ravel()), 'parameter')


class ReplayImu:
    """The node's IMU fusion in the offline run (module docstring)."""

    def __init__(self, config: ImuConfig, imu_from_camera: np.ndarray,
                 mounting: str = 'parameter') -> None:
        """Build the input and the tracker (attach it with :meth:`attach`).

        Args:
            config: the ``imu.*`` settings, ``topic`` the bag's IMU topic.
            imu_from_camera: [4, 4] mounting (camera optical frame into the IMU frame).
            mounting: where the mounting came from ('imu_truth' or 'parameter').
        """
        self.config = config
        self.input = ImuInput(config, _LOG.warning, info=_LOG.info)
        self.imu_from_camera = np.array(imu_from_camera, dtype=np.float64)
        self.mounting = mounting
        self.tracker = ImuScaleTracker(
            self.input.window, options=AlignmentOptions(max_imu_gap_s=config.max_gap_s),
            imu_from_camera=self.imu_from_camera,
            healthy=lambda stamp_s: self.input.state(stamp_s) == 'ok')
        self._session: Any = None
        self._locked = False
        self._first_pose_ns: int | None = None
        self._segment_sessions = 0
        self.locks = 0
        """Sessions whose scale locked."""
        self.lock_stamp_ns: int | None = None
        """Stamp of the first pose published with a locked scale (None: never)."""
        self.lock_gravity: np.ndarray | None = None
        """Gravity (unit, the pull) at the first lock, in the output's world frame (None when
        that lock was not in the first session of its segment, whose world is the output's)."""

    @classmethod
    def from_run(cls, run: ImuRun) -> 'ReplayImu':
        """Build from the run's IMU options."""
        return cls(run.config, np.reshape(run.imu_from_camera, (4, 4)), run.mounting)

    def attach(self, session: Any) -> None:
        """Attach the tracker to ``session`` (a ``RolloverSession``), before the first frame."""
        self._session = session
        self._segment_sessions = session.rollover_stats().sessions
        session.imu.attach(self.tracker)

    def order(self, messages: Iterable[bag_io.RawMessage], others: Iterable[str] = ()
              ) -> Iterator[bag_io.RawMessage]:
        """Yield every message but the IMU's, each image once the readings up to it were put.

        The readings of the IMU topic go into the input as they come (bag order, as the node
        would receive them); the other messages keep their order and wait, in turn, until the
        newest kept reading reaches the image's stamp (camera clock), until the bag has moved
        :data:`HOLD_S` past them, or the bag ends. Messages of ``others`` (the depth topic) are
        not colour images: they keep their place but wait for nothing.
        """
        not_images = set(others)
        held: deque[tuple[bag_io.RawMessage, float | None]] = deque()
        hold_ns = int(HOLD_S * 1e9)
        for raw in messages:
            if raw.topic == self.config.topic:
                self._put(raw)
            else:
                stamp = None if raw.topic in not_images else self._image_stamp(raw)
                if stamp is not None:
                    self.input.note_image(stamp)  # on arrival, as the node's subscription
                held.append((raw, stamp))
            newest = self.input.buffer.last_stamp
            while held:
                waiting, stamp = held[0]
                if not (stamp is None or (newest is not None and newest >= stamp)
                        or raw.log_time_ns - waiting.log_time_ns > hold_ns):
                    break
                yield held.popleft()[0]
        while held:
            yield held.popleft()[0]

    def _put(self, raw: bag_io.RawMessage) -> None:
        """Put one recorded IMU message (an undeserializable one is a ``bad_message``)."""
        try:
            msg = bag_io.deserialize(raw)
        except bag_io.BadMessageError:
            msg = None  # the input counts what is not an Imu as a bad_message
        self.input.put(msg)

    @staticmethod
    def _image_stamp(raw: bag_io.RawMessage) -> float | None:
        """Return an image's header stamp in seconds, None when it cannot be read."""
        try:
            return conversions.stamp_to_ns(bag_io.deserialize(raw).header.stamp) * 1e-9
        except (bag_io.BadMessageError, conversions.InvalidStampError):
            return None  # dropped with its reason when the run handles it

    def note_pose(self, stamp_ns: int) -> None:
        """Note a pose the run published: the first lock, its gravity, the locks counted."""
        if self._first_pose_ns is None:
            self._first_pose_ns = stamp_ns
        stats = self._session.imu.stats()
        locked = stats.state == 'locked'
        if locked and not self._locked:
            self.locks += 1
            if self.lock_stamp_ns is None:
                self.lock_stamp_ns = stamp_ns
                first = self._session.rollover_stats().sessions == self._segment_sessions
                self.lock_gravity = self._session.imu.gravity_continuous(None) \
                    if first else None
        self._locked = locked

    def new_segment(self) -> None:
        """Note a session reset: a new origin, whose first session's world is the output's."""
        self._segment_sessions = self._session.rollover_stats().sessions
        self._locked = False

    def summary(self, axes: np.ndarray) -> dict[str, Any]:
        """Return the summary's ``imu`` block (module docstring).

        Args:
            axes: [4, 4] output map axes from the engine's world (the run's ``map_axes``).
        """
        stats = self.tracker.stats()
        stream = self.input.status()
        gravity = None if self.lock_gravity is None else \
            (np.asarray(axes)[:3, :3] @ self.lock_gravity).tolist()
        lock_s = None if self.lock_stamp_ns is None else \
            round((self.lock_stamp_ns - self._first_pose_ns) * 1e-9, 3)
        return {
            'topic': stream['topic'], 'frame_id': stream['frame_id'],
            'readings': stream['received'], 'accepted': stream['accepted'],
            'rate_hz': round(stream['rate_hz'], 3), 'largest_gap_s': stream['largest_gap_s'],
            'drops': stream['drops'], 'pauses': stream['pauses'],
            'stream_state': stream['state'], 'time_offset_s': stream['time_offset_s'],
            'mounting': self.mounting, 'state': stats.state, 'scale': stats.scale,
            'scale_rel_std': stats.scale_rel_std, 'windows': stats.windows,
            'samples': stats.samples, 'reason': stats.reason, 'locks': self.locks,
            'lock_stamp_ns': self.lock_stamp_ns, 'lock_time_s': lock_s,
            'gravity_map': gravity,
            'gyro_bias': None if stats.gyro_bias is None else stats.gyro_bias.tolist(),
            'accel_bias': None if stats.accel_bias is None else stats.accel_bias.tolist()}


def require_topic(reader: Any, topic: str) -> bag_io.TopicInfo:
    """Return the IMU topic's info.

    Raises:
        BagError: the topic is missing or not ``sensor_msgs/Imu``.
    """
    try:
        return bag_io.require_topic(reader, topic, (IMU_TYPE,))
    except bag_io.BagError as exc:
        raise bag_io.BagError(f'--imu-topic: {exc}') from None


def _rigid_fit(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(R, t)`` of the least-squares ``dst ~ R src + t`` (no scale)."""
    mu_s, mu_d = src.mean(axis=0), dst.mean(axis=0)
    u, _, vt = np.linalg.svd((dst - mu_d).T @ (src - mu_s))
    sign = np.diag([1.0, 1.0, np.sign(np.linalg.det(u @ vt))])
    rotation = u @ sign @ vt
    return rotation, mu_d - rotation @ mu_s


def metric_part(est: Trajectory, lock_stamp_ns: int, segments: list[dict[str, Any]]
                ) -> Trajectory:
    """Return the poses from the first lock to the end of its map segment."""
    ends = [s['start_stamp_ns'] for s in segments[1:]
            if s.get('start_stamp_ns') is not None and s['start_stamp_ns'] > lock_stamp_ns]
    end = min(ends) if ends else np.iinfo(np.int64).max
    keep = (est.stamps_ns >= lock_stamp_ns) & (est.stamps_ns < end)
    return Trajectory(est.stamps_ns[keep], est.c2w[keep])


def evaluate(block: dict[str, Any], est: Trajectory, gt: Trajectory,
             segments: list[dict[str, Any]] | None = None,
             gravity_map: Any = None) -> dict[str, Any]:
    """Add the ground truth's figures to the ``imu`` block (module docstring); return it.

    Args:
        block: :meth:`ReplayImu.summary`.
        est: the run's camera poses in its map axes (``trajectory.tum``).
        gt: ground-truth camera poses, metres.
        segments: the run's map segments (a reset after the lock ends the metric part).
        gravity_map: [3] true gravity direction in the ground truth's frame.
    """
    if block.get('lock_stamp_ns') is None:
        return block
    metric = metric_part(est, block['lock_stamp_ns'], segments or [])
    est_idx, gt_idx = trajectory.associate(metric, gt)
    block['metric_poses'] = int(est_idx.size)
    if est_idx.size < 3:
        block['evaluation_error'] = 'fewer than 3 metric poses match the ground truth by stamp'
        return block
    est_p, gt_p = metric.c2w[est_idx, :3, 3], gt.c2w[gt_idx, :3, 3]
    fit_scale, _, _ = trajectory.align_sim3(est_p, gt_p)
    rotation, shift = _rigid_fit(est_p, gt_p)
    error = gt_p - (est_p @ rotation.T + shift)
    block['scale_error'] = 1.0 / fit_scale - 1.0
    block['metric_ate_m'] = float(np.sqrt(np.mean(np.sum(error ** 2, axis=1))))
    if gravity_map is not None and block.get('gravity_map') is not None:
        block['gravity_error_deg'] = float(np.degrees(so3.angle_between(
            rotation @ np.asarray(block['gravity_map'], dtype=np.float64),
            np.asarray(gravity_map, dtype=np.float64))))
    return block


def mounting(truth: dict[str, Any] | None) -> tuple[np.ndarray, float]:
    """Return the mounting and time offset of an ``--imu-truth`` file (identity and 0 without)."""
    if truth is None:
        return np.eye(4), 0.0
    mount = np.asarray(truth['imu_from_camera'], dtype=np.float64)
    if mount.shape != (4, 4) or not np.isfinite(mount).all():
        raise ValueError('--imu-truth: imu_from_camera must be a finite 4x4 matrix')
    return mount, float(truth.get('time_offset_s', 0.0))


def read_truth(path: str | None) -> dict[str, Any] | None:
    """Return an ``--imu-truth`` file's content (None without one).

    Raises:
        ValueError: not a JSON object.
    """
    if not path:
        return None
    truth = json.loads(Path(path).read_text(encoding='utf-8'))
    if not isinstance(truth, dict):
        raise ValueError(f'--imu-truth {path}: not a JSON object')
    return truth


def add_evaluation(out: Path, result: dict[str, Any], gt: str | None,
                   truth: dict[str, Any] | None) -> dict[str, Any]:
    """Evaluate the run's ``imu`` block against ``gt``; rewrite ``out/summary.json``; log it.

    Returns:
        The block.
    """
    block = result['imu']
    tum = out / 'trajectory.tum'
    if gt and tum.exists():
        evaluate(block, trajectory.read_tum(tum), trajectory.read_tum(gt),
                 result.get('segments'), None if truth is None else truth.get('gravity_map'))
        summary_path = out / 'summary.json'
        summary = json.loads(summary_path.read_text(encoding='utf-8'))
        summary['imu'] = block
        strict_json.write(summary_path, summary)
    line = (f"IMU: {block['accepted']}/{block['readings']} readings at {block['rate_hz']} Hz, "
            f"scale {block['state']}")
    if block['lock_stamp_ns'] is not None:
        line += f", metric from {block['lock_time_s']} s on ({block['locks']} session locks)"
    if 'metric_ate_m' in block:
        line += (f", scale error {100 * block['scale_error']:+.2f} %, metric ATE "
                 f"{block['metric_ate_m']:.4f} m over {block['metric_poses']} poses")
    if 'gravity_error_deg' in block:
        line += f", gravity error {block['gravity_error_deg']:.3f} deg"
    _LOG.info('%s%s', line, f" ({block['reason']})" if block['reason'] else '')
    return block
