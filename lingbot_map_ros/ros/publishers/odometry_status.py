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
"""The ``<node>: odometry`` diagnostic status: session rollovers and stitching.

Kept apart from ``diagnostics.py`` so its key set is its own: every key is present in every
state, from the first message on (before any rollover the alignment keys hold their neutral
values: scale 1, residual 0). The ``metric.*`` block is the depth camera's metric scale
(``engine/session/metric_session.py``); its values read ``n/a`` while unknown.
"""

from __future__ import annotations

from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from lingbot_map_ros.engine.session.metric_session import MetricStats
from lingbot_map_ros.engine.stats import RolloverStats
from lingbot_map_ros.ros.publishers.diagnostics import NOT_AVAILABLE

ODOMETRY_KEYS: tuple[str, ...] = (
    'odom_frame', 'base_frame', 'mounting', 'session_age_keyframes', 'session_keyframes',
    'sessions', 'rollovers', 'last_alignment_scale', 'last_alignment_residual',
    'last_alignment_degenerate', 'degenerate_alignments', 'rejected_scales',
    'last_rejected_scale', 'last_rollover_ms', 'max_rollover_ms', 'preparation',
    'last_switch_ms', 'last_switch_units', 'unprepared_switches') + (
    'metric.state', 'metric.scale', 'metric.valid_fraction', 'metric.inlier_fraction',
    'metric.spread', 'metric.depth_drops', 'metric.session_keyframes',
    'metric.frames_with_depth', 'metric.frames_without_depth', 'metric.sim3_scale',
    'metric.degenerate_sessions', 'metric.reason')
"""Keys of the status, in order."""


def odometry_status(node_name: str, rollover: RolloverStats, frames: dict[str, Any],
                    session_keyframes: int, metric: MetricStats = MetricStats(),
                    depth_drops: int = 0) -> DiagnosticStatus:
    """Render the odometry status.

    Args:
        node_name: prefix of the status name.
        rollover: ``RolloverSession.rollover_stats()``.
        frames: ``odom_frame``, ``base_frame`` and ``mounting`` ('parameter' or 'tf_static').
        session_keyframes: the configured session length (``stream.session_keyframes``).
        metric: ``RolloverSession.metric.stats()``.
        depth_drops: depth images dropped since start (``DepthInput.drops_total``).

    Returns:
        The ``<node>: odometry`` status; WARN while the last alignment could not observe
        scale or refused an implausible scale change (either way it kept the previous one), or
        while the session's metric scale is degenerate.
    """
    values = {
        'odom_frame': frames['odom_frame'], 'base_frame': frames['base_frame'],
        'mounting': frames['mounting'],
        'session_age_keyframes': rollover.session_keyframes,
        'session_keyframes': session_keyframes,
        'sessions': rollover.sessions, 'rollovers': rollover.rollovers,
        'last_alignment_scale': f'{rollover.last_scale:.6g}',
        'last_alignment_residual': f'{rollover.last_residual:.6g}',
        'last_alignment_degenerate': rollover.last_degenerate,
        'degenerate_alignments': rollover.degenerate_alignments,
        'rejected_scales': rollover.rejected_scales,
        'last_rejected_scale': 'none' if rollover.last_rejected_scale is None
        else f'{rollover.last_rejected_scale:.6g}',
        'last_rollover_ms': f'{rollover.last_rollover_ms:.1f}',
        'max_rollover_ms': f'{rollover.max_rollover_ms:.1f}',
        # The next session (engine/session/rollover.py): idle, preparing (a unit with each frame)
        # or ready; the switch latency is what the last rollover added to its frame.
        'preparation': rollover.preparation,
        'last_switch_ms': f'{rollover.last_rollover_ms:.1f}',
        'last_switch_units': rollover.last_switch_units,
        'unprepared_switches': rollover.unprepared_switches,
        **_metric_values(metric, depth_drops),
    }
    if rollover.last_rejected_scale is not None:
        level = DiagnosticStatus.WARN
        message = (f'last rollover fitted an implausible scale change '
                   f'({rollover.last_rejected_scale:.3g}, previous {rollover.last_scale:.3g}); '
                   'the previous scale was kept')
    elif metric.state == 'degenerate':
        level = DiagnosticStatus.WARN
        message = ('no metric scale for this session '
                   f"({metric.reason or 'no usable depth image paired with its keyframes'}): "
                   'model units, as without a depth camera')
    elif rollover.last_degenerate:
        level = DiagnosticStatus.WARN
        message = ('last rollover could not observe scale (camera nearly still over the '
                   'overlap); the previous scale was kept')
    else:
        level = DiagnosticStatus.OK
        message = (f'session {rollover.session_keyframes}/{session_keyframes} keyframes, '
                   f'{rollover.rollovers} rollovers, next session {rollover.preparation}')
        if metric.state != 'off':
            message += f', metric scale {metric.state}'
    return DiagnosticStatus(level=level, name=f'{node_name}: odometry', message=message,
                            hardware_id='', values=[KeyValue(key=k, value=str(values[k]))
                                                    for k in ODOMETRY_KEYS])


def _metric_values(metric: MetricStats, depth_drops: int) -> dict[str, Any]:
    """Return the ``metric.*`` values; a quantity not known yet reads ``n/a``."""
    def number(value: float | None) -> str:
        return NOT_AVAILABLE if value is None else f'{value:.6g}'
    return {
        'metric.state': metric.state, 'metric.scale': number(metric.scale),
        'metric.valid_fraction': number(metric.valid_fraction),
        'metric.inlier_fraction': number(metric.inlier_fraction),
        'metric.spread': number(metric.spread), 'metric.depth_drops': depth_drops,
        'metric.session_keyframes': metric.session_keyframes,
        'metric.frames_with_depth': metric.frames_with_depth,
        'metric.frames_without_depth': metric.frames_without_depth,
        'metric.sim3_scale': number(metric.sim3_scale),
        'metric.degenerate_sessions': metric.degenerate_sessions,
        'metric.reason': metric.reason or 'none',
    }
