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
"""The drop and reset reasons and their one policy table (engine/session/reasons.py).

Run: ``python -m pytest test/engine/test_reasons.py`` (under a second).
"""

import logging

from lingbot_map_ros.engine.session.reasons import node_reasons, POLICY, Reason
import pytest

# The stable counter keys (docs/robustness.md): monitors key on these names.
NODE_DROPS = ('encoding', 'size', 'step', 'truncated', 'decode', 'stamp_invalid',
              'queue_overflow', 'stamp_out_of_order', 'stamp_jump_ahead', 'resolution_mismatch',
              'invalid_frame', 'depth_encoding', 'depth_size', 'depth_stamp_invalid',
              'depth_no_valid_pixels', 'depth_stamp_stale', 'depth_stamp_future', 'depth_unpaired')
NODE_RESETS = ('manual', 'clock_jump', 'time_index_limit', 'cache_full', 'resolution_changed',
               'session_limit', 'nan_pose', 'engine_error')


def test_every_reason_has_one_policy():
    assert list(POLICY) == list(Reason)


def test_the_counter_keys_are_the_stable_strings():
    assert node_reasons(resets=False) == NODE_DROPS
    assert node_reasons(resets=True) == NODE_RESETS
    # The replay meets one more: a bag message that does not deserialize.
    assert [r.value for r in Reason if not POLICY[r].node] == ['bad_message']
    assert not POLICY[Reason.BAD_MESSAGE].resets
    # A reason is its key: it formats, compares and hashes as the string.
    assert f'drops.{Reason.STAMP_JUMP_AHEAD}' == 'drops.stamp_jump_ahead'
    assert Reason('cache_full') is Reason.CACHE_FULL and {Reason.MANUAL: 1}['manual'] == 1
    with pytest.raises(ValueError):
        Reason('no_such_reason')


@pytest.mark.parametrize('reason', list(Reason))
def test_what_each_reason_does(reason):
    policy = POLICY[reason]
    assert policy.counter == ('resets' if reason.value in NODE_RESETS else 'drops')
    # Only normal operation is no fault: the live queue keeping the newest frame, ~/reset.
    assert policy.fault == (reason not in (Reason.QUEUE_OVERFLOW, Reason.MANUAL))
    assert policy.error == (reason is Reason.ENGINE_ERROR)
    want_level = {Reason.QUEUE_OVERFLOW: logging.DEBUG, Reason.MANUAL: logging.INFO,
                  Reason.ENGINE_ERROR: logging.ERROR}.get(reason, logging.WARNING)
    assert policy.log_level == want_level
    # Resets that keep the frame: it starts the new map (the stamp jump) or is fed again
    # (the session limits); a NaN pose or an engine error loses it; drops keep nothing.
    assert policy.frame_kept == (reason in (
        Reason.CLOCK_JUMP, Reason.TIME_INDEX_LIMIT, Reason.CACHE_FULL,
        Reason.RESOLUTION_CHANGED, Reason.SESSION_LIMIT))
