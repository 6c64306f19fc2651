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
"""Stall detection for ``/diagnostics``: a frame that has been in progress for too long.

A frame stuck in the engine (a hung GPU, a deadlocked driver, a huge input) shows nowhere else:
the input status still sees images arriving and the engine counters simply stop. The worker
marks when it starts and ends each frame (``SessionRunner.busy_s``); each diagnostics period
:func:`mark_stall` adds ``frame_in_progress_s`` to the engine status (0 when idle, so the key set
is stable) and raises it to ERROR past ``diagnostics.stall_after_s``.
"""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

STALL_KEY = 'frame_in_progress_s'


def mark_stall(status: DiagnosticStatus, busy_s: float | None,
               stall_after_s: float) -> DiagnosticStatus:
    """Add the in-progress time to an engine status; ERROR when it is past the threshold.

    Args:
        status: the engine status of this period (modified in place).
        busy_s: seconds the current frame has been in progress, None when idle.
        stall_after_s: threshold (``diagnostics.stall_after_s``).

    Returns:
        ``status``.
    """
    busy = busy_s or 0.0
    status.values.append(KeyValue(key=STALL_KEY, value=f'{busy:.1f}'))
    if busy > stall_after_s:
        status.level = DiagnosticStatus.ERROR
        status.message = (f'stalled: one frame in progress for {busy:.1f} s (more than '
                          f'{stall_after_s:g} s)')
    return status
