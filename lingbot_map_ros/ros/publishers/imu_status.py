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
"""The ``<node>: imu`` diagnostic status: the IMU stream, its alignment and the scale state.

Kept apart from ``diagnostics.py`` so its key set is its own: every key is present in every
state (a quantity not known yet reads ``n/a``). The ``stream.*`` block is the input
(``ros/inference/imu_input.py``: rate, gaps, drops by reason, the time offset applied), the
``scale.*`` block the tracker (``engine/imu/scale_tracker.py``: state, scale, biases, gravity
residual), and ``depth.*`` the check against the depth camera's scale when both are there.
``gravity.frame`` says which frame the IMU levelled for this origin (``odom`` at the anchor,
``map`` later, ``none`` yet; ``engine/imu/leveling.py``) and ``gravity.tilt_deg`` the tilt that
levelling corrects.
"""

from __future__ import annotations

from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from lingbot_map_ros.engine.imu import DROP_REASONS, ImuStats, scale_disagreement
from lingbot_map_ros.ros.publishers.diagnostics import NOT_AVAILABLE

MAX_DISAGREEMENT = 0.05
"""Relative difference of the IMU and depth scales above which the status WARNs."""

IMU_KEYS: tuple[str, ...] = (
    'topic', 'frame_id', 'stream.state', 'stream.rate_hz', 'stream.largest_gap_s',
    'stream.received', 'stream.accepted') + tuple(f'stream.drops.{r}' for r in DROP_REASONS) + (
    'time_offset_s', 'scale.state', 'scale.scale', 'scale.rel_std', 'scale.samples',
    'scale.windows', 'scale.session_keyframes', 'scale.degenerate_sessions', 'scale.reason',
    'gyro_bias', 'accel_bias', 'gravity', 'gravity_residual_deg', 'depth.scale',
    'depth.disagreement', 'stream.pauses', 'mounting', 'gravity.frame', 'gravity.tilt_deg')
"""Keys of the status, in order."""


def _number(value: float | None) -> str:
    return NOT_AVAILABLE if value is None else f'{value:.6g}'


def _vector(value: Any) -> str:
    return NOT_AVAILABLE if value is None else ' '.join(f'{v:.6g}' for v in value)


def imu_status(node_name: str, stream: dict[str, Any], stats: ImuStats,
               depth_scale: float | None = None,
               level: tuple[str, float | None] = ('none', None)) -> DiagnosticStatus:
    """Render the imu status.

    Args:
        node_name: prefix of the status name.
        stream: ``ImuInput.status()``.
        stats: ``ImuScaleTracker.stats()``.
        depth_scale: the depth camera's scale of the same session (None without one).
        level: ``GravityLevel.state()``: the levelled frame and its tilt in degrees.

    Returns:
        The ``<node>: imu`` status: WARN while the stream is slow or silent (fusion paused),
        while the session's motion is degenerate, or when the IMU and depth scales disagree by
        more than :data:`MAX_DISAGREEMENT`; OK otherwise.
    """
    disagreement = scale_disagreement(stats.scale, depth_scale)
    drops = stream.get('drops', {})
    values = {
        'topic': stream.get('topic', ''), 'frame_id': stream.get('frame_id', '') or NOT_AVAILABLE,
        'stream.state': stream.get('state', 'waiting'),
        'stream.rate_hz': f"{stream.get('rate_hz', 0.0):.1f}",
        'stream.largest_gap_s': f"{stream.get('largest_gap_s', 0.0):.4f}",
        'stream.received': stream.get('received', 0),
        'stream.accepted': stream.get('accepted', 0),
        **{f'stream.drops.{r}': drops.get(r, 0) for r in DROP_REASONS},
        'time_offset_s': f"{stream.get('time_offset_s', 0.0):.6g}",
        'scale.state': stats.state, 'scale.scale': _number(stats.scale),
        'scale.rel_std': _number(stats.scale_rel_std), 'scale.samples': stats.samples,
        'scale.windows': stats.windows, 'scale.session_keyframes': stats.session_keyframes,
        'scale.degenerate_sessions': stats.degenerate_sessions,
        'scale.reason': stats.reason or 'none',
        'gyro_bias': _vector(stats.gyro_bias), 'accel_bias': _vector(stats.accel_bias),
        'gravity': _vector(stats.gravity),
        'gravity_residual_deg': _number(stats.gravity_residual_deg),
        'depth.scale': _number(depth_scale), 'depth.disagreement': _number(disagreement),
        'stream.pauses': stream.get('pauses', 0),
        'mounting': stream.get('mounting', 'parameter'),
        'gravity.frame': level[0], 'gravity.tilt_deg': _number(level[1]),
    }
    state = values['stream.state']
    if state in ('slow', 'silent'):
        level = DiagnosticStatus.WARN
        message = (f"IMU {state} ({values['stream.rate_hz']} Hz): fusion paused, the last "
                   'scale and gravity kept')
    elif stats.state == 'degenerate':
        level = DiagnosticStatus.WARN
        message = f'no IMU scale for this session: {stats.reason}'
    elif disagreement is not None and abs(disagreement) > MAX_DISAGREEMENT:
        level = DiagnosticStatus.WARN
        message = (f'IMU scale {stats.scale:.4g} and depth scale {depth_scale:.4g} disagree by '
                   f'{100.0 * disagreement:+.1f} %')
    else:
        level = DiagnosticStatus.OK
        message = f"IMU {state}, {values['stream.rate_hz']} Hz, scale {stats.state}"
        if stats.scale is not None:
            message += f' ({stats.scale:.4g} m per model unit)'
    return DiagnosticStatus(level=level, name=f'{node_name}: imu', message=message,
                            hardware_id='', values=[KeyValue(key=k, value=str(values[k]))
                                                    for k in IMU_KEYS])
