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
values: scale 1, residual 0).
"""

from __future__ import annotations

from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from lingbot_map_ros.engine.stats import RolloverStats

ODOMETRY_KEYS: tuple[str, ...] = (
    'odom_frame', 'base_frame', 'mounting', 'session_age_keyframes', 'session_keyframes',
    'sessions', 'rollovers', 'last_alignment_scale', 'last_alignment_residual',
    'last_alignment_degenerate', 'degenerate_alignments', 'rejected_scales',
    'last_rejected_scale', 'last_rollover_ms', 'max_rollover_ms')
"""Keys of the status, in order."""


def odometry_status(node_name: str, rollover: RolloverStats, frames: dict[str, Any],
                    session_keyframes: int) -> DiagnosticStatus:
    """Render the odometry status.

    Args:
        node_name: prefix of the status name.
        rollover: ``RolloverSession.rollover_stats()``.
        frames: ``odom_frame``, ``base_frame`` and ``mounting`` ('parameter' or 'tf_static').
        session_keyframes: the configured session length (``stream.session_keyframes``).

    Returns:
        The ``<node>: odometry`` status; WARN while the last alignment could not observe
        scale or refused an implausible scale change (either way it kept the previous one).
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
    }
    if rollover.last_rejected_scale is not None:
        level = DiagnosticStatus.WARN
        message = (f'last rollover fitted an implausible scale change '
                   f'({rollover.last_rejected_scale:.3g}, previous {rollover.last_scale:.3g}); '
                   'the previous scale was kept')
    elif rollover.last_degenerate:
        level = DiagnosticStatus.WARN
        message = ('last rollover could not observe scale (camera nearly still over the '
                   'overlap); the previous scale was kept')
    else:
        level = DiagnosticStatus.OK
        message = (f'session {rollover.session_keyframes}/{session_keyframes} keyframes, '
                   f'{rollover.rollovers} rollovers')
    return DiagnosticStatus(level=level, name=f'{node_name}: odometry', message=message,
                            hardware_id='', values=[KeyValue(key=k, value=str(values[k]))
                                                    for k in ODOMETRY_KEYS])
