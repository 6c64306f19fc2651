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
"""Why a frame was dropped or a session was reset: one type and one policy table.

Every drop and reset that the feeder (``stream_feeder.py``), the node's worker
(``ros/inference/session_runner.py``), the offline replay (``tools/offline.py``) and the
diagnostics (``ros/publishers/diagnostics.py``) handle is a :class:`Reason`. Its value is the
stable counter key: ``drops.<value>`` / ``resets.<value>`` in ``/diagnostics``, ``drops`` and the
segment reasons in the replay's ``summary.json`` (docs/robustness.md lists them). :data:`POLICY`
says what each one does, so no caller keeps its own list:

=======================  =====  =====  =======  ===============================================
reason                   kind   fault  log      the frame
=======================  =====  =====  =======  ===============================================
image checks [1]_        drop   yes    WARNING  dropped
``bad_message``          drop   yes    WARNING  dropped (replay only: undeserializable)
``stamp_invalid``        drop   yes    WARNING  dropped
``queue_overflow``       drop   no     DEBUG    replaced by a newer one (live queue, by design)
``stamp_out_of_order``   drop   yes    WARNING  dropped
``stamp_jump_ahead``     drop   yes    WARNING  dropped (a held frame nothing confirmed)
``resolution_mismatch``  drop   yes    WARNING  dropped, the map is kept
``invalid_frame``        drop   yes    WARNING  dropped (the engine refused it)
depth image checks [3]_  drop   yes    WARNING  the depth image is dropped, the colour frame kept
``manual``               reset  no     INFO     none (``~/reset``)
``clock_jump``           reset  yes    WARNING  starts the new map
session limits [2]_      reset  yes    WARNING  fed again: starts the new map
``nan_pose``             reset  yes    WARNING  lost
``engine_error``         reset  yes    ERROR    lost; also counted as an engine error
=======================  =====  =====  =======  ===============================================

.. [1] ``encoding``, ``size``, ``step``, ``truncated``, ``decode``: the values of
   ``ros/messages/image_decode.py``'s ``ImageConversionError.reason``.
.. [2] ``time_index_limit``, ``cache_full``, ``resolution_changed``, ``session_limit``.
.. [3] :data:`DEPTH_DROPS`: a depth image (``metric.source: depth``,
   ``ros/inference/depth_input.py``) that cannot be used or paired.

"fault" means a problem worth a WARN status and ``last_problem``; the others are normal
operation (counted, shown, never a warning).
"""

from __future__ import annotations

from dataclasses import dataclass
import enum
import logging


class Reason(enum.StrEnum):
    """Why a frame was dropped or the session reset; the value is the counter key."""

    ENCODING = 'encoding'
    SIZE = 'size'
    STEP = 'step'
    TRUNCATED = 'truncated'
    DECODE = 'decode'
    BAD_MESSAGE = 'bad_message'
    STAMP_INVALID = 'stamp_invalid'
    QUEUE_OVERFLOW = 'queue_overflow'
    STAMP_OUT_OF_ORDER = 'stamp_out_of_order'
    STAMP_JUMP_AHEAD = 'stamp_jump_ahead'
    RESOLUTION_MISMATCH = 'resolution_mismatch'
    INVALID_FRAME = 'invalid_frame'
    DEPTH_ENCODING = 'depth_encoding'
    DEPTH_SIZE = 'depth_size'
    DEPTH_STAMP_INVALID = 'depth_stamp_invalid'
    DEPTH_NO_VALID_PIXELS = 'depth_no_valid_pixels'
    DEPTH_STAMP_STALE = 'depth_stamp_stale'
    DEPTH_STAMP_FUTURE = 'depth_stamp_future'
    DEPTH_UNPAIRED = 'depth_unpaired'
    MANUAL = 'manual'
    CLOCK_JUMP = 'clock_jump'
    TIME_INDEX_LIMIT = 'time_index_limit'
    CACHE_FULL = 'cache_full'
    RESOLUTION_CHANGED = 'resolution_changed'
    SESSION_LIMIT = 'session_limit'
    NAN_POSE = 'nan_pose'
    ENGINE_ERROR = 'engine_error'


@dataclass(frozen=True, slots=True)
class ReasonPolicy:
    """What one :class:`Reason` does (the table in the module docstring)."""

    resets: bool
    """The session is reset (a new map); otherwise only the frame is dropped."""
    fault: bool = True
    """A problem: WARN status and ``last_problem``; False for normal operation."""
    log_level: int = logging.WARNING
    """``logging`` level of the message written for it."""
    frame_kept: bool = False
    """For a reset: the frame then goes into the new session; otherwise it is lost."""
    error: bool = False
    """An unexpected engine error: also counted as an error (engine status ERROR)."""
    node: bool = True
    """The node can meet it (its counter is listed from the start); False: the replay only."""

    @property
    def counter(self) -> str:
        """Prefix of the counter: ``drops`` or ``resets``."""
        return 'resets' if self.resets else 'drops'


_DROP = ReasonPolicy(resets=False)
DEPTH_DROPS = (Reason.DEPTH_ENCODING, Reason.DEPTH_SIZE, Reason.DEPTH_STAMP_INVALID,
               Reason.DEPTH_NO_VALID_PIXELS, Reason.DEPTH_STAMP_STALE, Reason.DEPTH_STAMP_FUTURE,
               Reason.DEPTH_UNPAIRED)
"""Why a depth image (not its colour frame) is dropped."""
_LIMIT = ReasonPolicy(resets=True, frame_kept=True)

POLICY: dict[Reason, ReasonPolicy] = {
    Reason.ENCODING: _DROP,
    Reason.SIZE: _DROP,
    Reason.STEP: _DROP,
    Reason.TRUNCATED: _DROP,
    Reason.DECODE: _DROP,
    Reason.BAD_MESSAGE: ReasonPolicy(resets=False, node=False),
    Reason.STAMP_INVALID: _DROP,
    Reason.QUEUE_OVERFLOW: ReasonPolicy(resets=False, fault=False, log_level=logging.DEBUG),
    Reason.STAMP_OUT_OF_ORDER: _DROP,
    Reason.STAMP_JUMP_AHEAD: _DROP,
    Reason.RESOLUTION_MISMATCH: _DROP,
    Reason.INVALID_FRAME: _DROP,
    **dict.fromkeys(DEPTH_DROPS, _DROP),
    Reason.MANUAL: ReasonPolicy(resets=True, fault=False, log_level=logging.INFO),
    Reason.CLOCK_JUMP: _LIMIT,
    Reason.TIME_INDEX_LIMIT: _LIMIT,
    Reason.CACHE_FULL: _LIMIT,
    Reason.RESOLUTION_CHANGED: _LIMIT,
    Reason.SESSION_LIMIT: _LIMIT,
    Reason.NAN_POSE: ReasonPolicy(resets=True),
    Reason.ENGINE_ERROR: ReasonPolicy(resets=True, log_level=logging.ERROR, error=True),
}
"""Every reason's policy (a test checks that no reason is missing)."""


def node_reasons(resets: bool) -> tuple[str, ...]:
    """Counter keys the node lists from the start: its reset (or drop) reasons, in order."""
    return tuple(r.value for r in Reason if POLICY[r].resets == resets and POLICY[r].node)
