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
"""Diagnostic levels and values of ros/diagnostics.py, from counters to DiagnosticStatus.

Run: ``pytest test/ros/test_node_diagnostics.py`` (under a second; no ROS graph).
"""

import time

from lingbot_map_ros.ros import diagnostics
from lingbot_map_ros.ros.diagnostics import ERROR, NodeStats, OK, STALE, WARN

INFO = {'topic': '/cam/image', 'transport': 'raw', 'queue_mode': 'live', 'queue_length': 0}
SESSION = {'frames_out': 12, 'keyframes': 12, 'pending_frames': 0, 'time_index': 12,
           'backend': 'sdpa', 'device': 'cpu', 'weights': 'w.pt',
           'cache': {'frame_count': 12, 'live_pages': 4, 'max_total_frames': 100}}


def values(status):
    return {kv.key: kv.value for kv in status.values}


def test_input_is_stale_until_images_arrive_then_ok():
    stats = NodeStats()
    status = diagnostics.input_status('cam/lingbot_map', stats.roll(), INFO, 5.0)
    assert status.level == STALE and '/cam/image' in status.message
    assert status.name == 'cam/lingbot_map: input'
    stats.count_received()
    stats.count_received()
    status = diagnostics.input_status('n', stats.roll(), INFO, 5.0)
    assert status.level == OK
    assert values(status)['received_total'] == '2'


def test_input_goes_stale_after_silence():
    stats = NodeStats()
    stats.count_received()
    time.sleep(0.05)
    assert diagnostics.input_status('n', stats.roll(), INFO, 0.01).level == STALE


def test_drops_warn_once_per_period_except_live_overflow():
    stats = NodeStats()
    stats.count_received()
    stats.count_drop('queue_overflow', num=3)
    status = diagnostics.input_status('n', stats.roll(), INFO, 5.0)
    assert status.level == OK and values(status)['drops.queue_overflow'] == '3'
    stats.count_received()
    stats.count_drop('encoding', "unsupported encoding '32FC1'")
    status = diagnostics.input_status('n', stats.roll(), INFO, 5.0)
    assert status.level == WARN and '1 encoding' in status.message
    assert '32FC1' in values(status)['last_problem']
    stats.count_received()
    status = diagnostics.input_status('n', stats.roll(), INFO, 5.0)
    assert status.level == OK  # the next period is clean again; totals stay
    assert values(status)['drops_total'] == '4'


def test_engine_levels_and_latency():
    stats = NodeStats()
    assert diagnostics.engine_status('n', stats.roll(), {'frames_out': 0, 'pending_frames': 2},
                                     8).message == 'buffering scale frames (2/8)'
    stats.count_output(40.0, 20.0)
    stats.count_output(60.0, 30.0)
    status = diagnostics.engine_status('n', stats.roll(), SESSION, 8)
    v = values(status)
    assert status.level == OK
    assert (v['latency_mean_ms'], v['latency_max_ms']) == ('50.000', '60.000')
    assert v['inference_max_ms'] == '30.000' and v['backend'] == 'sdpa' and 'cache' not in v
    stats.count_reset('manual')
    assert diagnostics.engine_status('n', stats.roll(), SESSION, 8).level == OK
    stats.count_reset('time_index_limit', 'time index 1024')
    status = diagnostics.engine_status('n', stats.roll(), SESSION, 8)
    assert status.level == WARN and 'time_index_limit' in status.message
    assert values(status)['resets.time_index_limit'] == '1'
    stats.count_error('RuntimeError: boom')
    status = diagnostics.engine_status('n', stats.roll(), SESSION, 8)
    assert status.level == ERROR and 'boom' in status.message


def test_cache_warns_near_its_ceilings():
    status = diagnostics.cache_status('n', SESSION['cache'], 12, 1024)
    assert status.level == OK and values(status)['frame_count'] == '12'
    full = dict(SESSION['cache'], frame_count=95)
    assert diagnostics.cache_status('n', full, 95, 1024).level == WARN
    assert diagnostics.cache_status('n', SESSION['cache'], 1000, 1024).level == WARN
