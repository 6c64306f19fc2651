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
"""The ``imu`` diagnostic status: every key always there, levels for each state.

Run: ``python -m pytest test/ros/test_imu_status.py`` (instant).
"""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticStatus
from lingbot_map_ros.engine.imu import ImuStats
from lingbot_map_ros.ros.publishers.imu_status import IMU_KEYS, imu_status
import numpy as np
import pytest

STREAM = {'topic': '/imu', 'frame_id': 'imu_link', 'received': 410, 'accepted': 400,
          'rate_hz': 200.0, 'largest_gap_s': 0.006,
          'drops': {'non_finite': 4, 'wrong_frame': 6}, 'state': 'ok', 'time_offset_s': 0.003}
LOCKED = ImuStats(state='locked', scale=0.42, gravity=np.array([0.0, 0.6, -0.8]),
                  gyro_bias=np.array([0.01, -0.02, 0.003]), accel_bias=np.zeros(3),
                  gravity_residual_deg=0.2, scale_rel_std=0.004, samples=3, windows=4,
                  session_keyframes=40)


def _values(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def test_every_key_in_order_before_anything_is_known() -> None:
    """A fresh IMU (nothing received, tracker waiting): all keys, unknowns n/a, OK."""
    status = imu_status('lingbot_map', {'topic': '/imu'}, ImuStats(state='waiting'))
    assert [kv.key for kv in status.values] == list(IMU_KEYS)
    values = _values(status)
    assert values['scale.scale'] == 'n/a' and values['gravity'] == 'n/a'
    assert values['stream.drops.non_finite'] == '0'
    assert status.level == DiagnosticStatus.OK
    assert status.name == 'lingbot_map: imu'


def test_locked_scale_reports_bias_gravity_and_drops() -> None:
    """Locked: scale, biases, gravity, drops by reason and the time offset are shown."""
    values = _values(imu_status('n', STREAM, LOCKED))
    bias = [float(v) for v in values['gyro_bias'].split()]
    assert bias == pytest.approx([0.01, -0.02, 0.003])
    assert [float(v) for v in values['gyro_bias'].split()] == pytest.approx([0.01, -0.02, 0.003])
    assert values['stream.drops.wrong_frame'] == '6'
    assert values['stream.drops.saturated'] == '0'
    assert float(values['time_offset_s']) == pytest.approx(0.003)
    assert float(values['stream.rate_hz']) == pytest.approx(200.0)


def test_slow_stream_and_degenerate_motion_warn() -> None:
    """A slow stream pauses the fusion (WARN); a degenerate session WARNs with its reason."""
    slow = imu_status('n', {**STREAM, 'state': 'slow', 'rate_hz': 5.0}, LOCKED)
    assert slow.level == DiagnosticStatus.WARN and 'paused' in slow.message
    degenerate = imu_status('n', STREAM, ImuStats(state='degenerate',
                                                  reason='degenerate motion: scale 0.1'))
    assert degenerate.level == DiagnosticStatus.WARN
    assert 'degenerate motion' in degenerate.message


def test_depth_and_imu_scales_compared() -> None:
    """With a depth camera the disagreement is reported; above 5 % it WARNs."""
    close = imu_status('n', STREAM, LOCKED, depth_scale=0.41)
    assert close.level == DiagnosticStatus.OK
    assert abs(float(_values(close)['depth.disagreement']) - (0.42 / 0.41 - 1.0)) < 1e-6
    far = imu_status('n', STREAM, LOCKED, depth_scale=0.36)
    assert far.level == DiagnosticStatus.WARN and 'disagree' in far.message


def test_pauses_and_the_mounting_source_are_shown() -> None:
    """A silent stream that paused twice, its mounting from /tf_static: both in the status."""
    status = imu_status('n', {**STREAM, 'state': 'silent', 'pauses': 2, 'mounting': 'tf'},
                        LOCKED)
    values = _values(status)
    assert values['stream.pauses'] == '2' and values['mounting'] == 'tf'
    assert status.level == DiagnosticStatus.WARN and 'silent' in status.message
    fresh = _values(imu_status('n', {'topic': '/imu'}, ImuStats(state='waiting')))
    assert fresh['stream.pauses'] == '0' and fresh['mounting'] == 'parameter'
