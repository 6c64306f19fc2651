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
"""Depth images for the metric scale: REP 118 conversion, pairing by stamp, counted drops.

Run: ``python -m pytest test/ros/test_depth_input.py`` (instant; no ROS graph).
"""

from __future__ import annotations

import threading

from lingbot_map_ros.config import MetricConfig
from lingbot_map_ros.ros.inference.depth_input import (DEPTH_DROP_REASONS, depth_msg_to_metres,
                                                       DepthConversionError, DepthInput, FUTURE_S)
import numpy as np
import pytest
from sensor_msgs.msg import Image

SEC = 1_000_000_000


def depth_msg(values: np.ndarray, stamp_ns: int, encoding: str = '16UC1',
              big_endian: bool = False, pad: int = 0) -> Image:
    """Build a depth ``sensor_msgs/Image`` from mm (uint16) or metres (float32)."""
    dtype = {'16UC1': 'u2', 'mono16': 'u2', '32FC1': 'f4'}.get(encoding, 'u2')
    array = np.asarray(values).astype(('>' if big_endian else '<') + dtype)
    rows = array.view(np.uint8).reshape(array.shape[0], -1)
    rows = np.concatenate([rows, np.zeros((rows.shape[0], pad), np.uint8)], axis=1)
    msg = Image(height=array.shape[0], width=array.shape[1], encoding=encoding,
                is_bigendian=int(big_endian), step=rows.shape[1])
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, SEC)
    msg.data = rows.tobytes()
    return msg


class Recorder:
    """Counts drops by reason and keeps the log lines."""

    def __init__(self) -> None:
        self.drops: dict[str, int] = {}
        self.lines: list[str] = []

    def count(self, reason: str, detail: str) -> None:
        assert reason in DEPTH_DROP_REASONS and detail
        self.drops[reason] = self.drops.get(reason, 0) + 1


def make_input(capacity: int = 8, **metric) -> tuple[DepthInput, Recorder]:
    rec = Recorder()
    config = MetricConfig(source='depth', **{'depth_wait_s': 0.0, **metric})
    return DepthInput(config, capacity, rec.count, rec.lines.append), rec


def test_encodings_are_converted_to_metres():
    mm = np.array([[0, 1000, 2500], [65535, 1, 300]], np.uint16)
    for encoding, big in (('16UC1', False), ('mono16', True)):
        out = depth_msg_to_metres(depth_msg(mm, 0, encoding, big, pad=4))
        assert out.dtype == np.float32 and out.shape == (2, 3)
        np.testing.assert_allclose(out, mm * 1e-3, rtol=1e-6)
    metres = np.array([[np.nan, 1.25], [0.0, 7.5]], np.float32)
    out = depth_msg_to_metres(depth_msg(metres, 0, '32FC1', big_endian=True))
    np.testing.assert_allclose(out, metres, rtol=1e-7, equal_nan=True)


@pytest.mark.parametrize('case, reason', [
    ('rgb8', 'depth_encoding'), ('16SC1', 'depth_encoding'), ('empty', 'depth_size'),
    ('step', 'depth_size'), ('truncated', 'depth_size'), ('zeros', 'depth_no_valid_pixels'),
    ('nans', 'depth_no_valid_pixels')])
def test_bad_depth_messages_name_their_reason(case, reason):
    msg = depth_msg(np.full((4, 6), 1000, np.uint16), 0)
    if case in ('rgb8', '16SC1'):
        msg.encoding = case
    elif case == 'empty':
        msg.width = 0
    elif case == 'step':
        msg.step = 11
    elif case == 'truncated':
        msg.data = msg.data[:-2]
    elif case == 'zeros':
        msg = depth_msg(np.zeros((4, 6), np.uint16), 0)
    else:
        msg = depth_msg(np.full((4, 6), np.nan, np.float32), 0, '32FC1')
    with pytest.raises(DepthConversionError) as info:
        depth_msg_to_metres(msg)
    assert info.value.reason == reason


def test_pairs_the_nearest_depth_within_max_dt():
    depth, rec = make_input(max_dt_s=0.005)
    for offset_ms, value in ((-4, 1000), (3, 2000), (20, 3000)):
        depth.put(depth_msg(np.full((2, 2), value), 10 * SEC + offset_ms * 1_000_000))
    out = depth.take(10 * SEC, (2, 2))
    np.testing.assert_allclose(out, np.full((2, 2), 2.0), rtol=1e-6)  # 3 ms beats 4 ms
    assert depth.take(10 * SEC + 10_000_000, (2, 2)) is None  # 10 ms from 20 ms: too far
    np.testing.assert_allclose(depth.take(10 * SEC + 21_000_000, (2, 2)), np.full((2, 2), 3.0),
                               rtol=1e-6)
    assert rec.drops == {'depth_unpaired': 1}  # -4 ms: passed by the frames, counted
    assert depth.paired_total == 2 and depth.buffered == 0


def test_stale_future_overflow_and_size_are_counted_drops():
    depth, rec = make_input(capacity=3)
    depth.note_colour(_stamp(10 * SEC))
    depth.put(depth_msg(np.ones((2, 2)), 10 * SEC))
    assert depth.take(10 * SEC, (2, 2)) is not None
    depth.put(depth_msg(np.ones((2, 2)), 9 * SEC))                        # before that frame
    depth.put(depth_msg(np.ones((2, 2)), 10 * SEC + int(FUTURE_S * SEC) + 1))  # far ahead
    for i in range(5):                                                    # no colour at all
        depth.put(depth_msg(np.ones((2, 2)), 11 * SEC + i * SEC // 10))
    depth.put(depth_msg(np.ones((4, 4)), 12 * SEC))
    assert depth.take(12 * SEC, (2, 2)) is None                           # another size
    bad = depth_msg(np.ones((2, 2)), 13 * SEC)
    bad.header.stamp.nanosec = 2 * SEC
    depth.put(bad)
    # Unpaired: 3 pushed out of the full buffer, 2 passed by the 12 s frame.
    assert rec.drops == {'depth_stamp_stale': 1, 'depth_stamp_future': 1,
                         'depth_unpaired': 5, 'depth_size': 1, 'depth_stamp_invalid': 1}
    assert depth.drops_total == 9
    assert depth.received_total == depth.paired_total + depth.drops_total + depth.buffered
    # One log line per reason within the throttle period.
    assert sorted(line.split('(')[1].split(')')[0] for line in rec.lines) == sorted(rec.drops)


def test_a_colour_frame_waits_for_its_late_depth_while_the_stream_is_alive():
    depth, rec = make_input(depth_wait_s=30.0)
    depth.put(depth_msg(np.ones((2, 2)), 1 * SEC))  # the stream is alive
    late = threading.Timer(0.2, depth.put, [depth_msg(np.full((2, 2), 4000), 2 * SEC)])
    late.start()
    out = depth.take(2 * SEC, (2, 2))
    late.join()
    np.testing.assert_allclose(out, np.full((2, 2), 4.0), rtol=1e-6)
    # The stream already passed this stamp: no wait, no pair.
    depth.put(depth_msg(np.ones((2, 2)), 4 * SEC))
    assert depth.take(3 * SEC, (2, 2)) is None
    assert rec.drops == {'depth_unpaired': 1}  # the 1 s image: no frame of its own came


def test_no_wait_when_the_depth_stream_is_silent():
    clock = [100.0]
    rec = Recorder()
    depth = DepthInput(MetricConfig(source='depth', depth_wait_s=30.0), 4, rec.count,
                       rec.lines.append, clock=lambda: clock[0])
    assert depth.take(SEC, (2, 2)) is None  # never a depth message: returns at once
    depth.put(depth_msg(np.ones((2, 2)), SEC // 2))
    clock[0] += 5.0                         # the stream stopped 5 s ago
    assert depth.take(2 * SEC, (2, 2)) is None


def _stamp(stamp_ns: int):
    msg = Image()
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, SEC)
    return msg.header.stamp
