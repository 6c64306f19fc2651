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
"""Depth pairing that one message cannot poison, every depth image accounted for (issue #36).

No threads and no timing: the buffer's condition is replaced by one whose ``wait`` either
delivers the next depth message (it arrives while the colour frame waits) or lets the whole
timeout pass on a fake clock, so what a colour frame waits is measured exactly.

Run: ``python -m pytest test/ros/test_depth_pairing_round4.py`` (instant; no ROS graph).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from lingbot_map_ros.config import MetricConfig
from lingbot_map_ros.ros.inference.depth_input import (DEPTH_DROP_REASONS, DepthInput,
                                                       from_values, MAX_BUFFER_BYTES)
import numpy as np
import pytest
from sensor_msgs.msg import Image
from test_depth_input import depth_msg, Recorder

SEC = 1_000_000_000
PERIOD = SEC // 30


class WaitWithArrivals(threading.Condition):
    """A condition whose ``wait`` delivers the next arrival, else lets the timeout pass."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock
        self.arrivals: list[Callable[[], None]] = []
        self.waited_s = 0.0

    def wait(self, timeout: float | None = None) -> bool:
        if self.arrivals:
            self.arrivals.pop(0)()  # the lock is re-entrant: put() runs as from the callback
            return True
        self.clock[0] += timeout
        self.waited_s += timeout
        return False


def make(wait_s: float = 0.05, capacity: int = 16, max_bytes: int = MAX_BUFFER_BYTES,
         **metric: Any) -> tuple[DepthInput, Recorder, WaitWithArrivals]:
    clock = [1000.0]
    rec = Recorder()
    cond = WaitWithArrivals(clock)
    depth = DepthInput(MetricConfig(source='depth', depth_wait_s=wait_s, **metric), capacity,
                       rec.count, rec.lines.append, clock=lambda: clock[0],
                       max_bytes=max_bytes, condition=cond)
    depth.has_source = lambda: True  # a depth publisher is matched (the node's case)
    return depth, rec, cond


def _stamp(stamp_ns: int) -> Any:
    msg = Image()
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, SEC)
    return msg.header.stamp


def _accounted(depth: DepthInput) -> bool:
    return depth.received_total == depth.paired_total + depth.drops_total + depth.buffered


def _frames_with_late_depth(depth: DepthInput, cond: WaitWithArrivals, first: int, num: int,
                            clock: list[float] | None = None) -> int:
    """Colour frames whose depth arrives while they wait; returns how many paired."""
    paired = 0
    for i in range(first, first + num):
        stamp = 10 * SEC + i * PERIOD
        depth.note_colour(_stamp(stamp))
        cond.arrivals.append(lambda s=stamp: depth.put(depth_msg(np.full((2, 2), 1500), s)))
        paired += depth.take(stamp, (2, 2)) is not None
        for late in cond.arrivals:  # not waited for: it arrives after the frame
            late()
        cond.arrivals.clear()
        cond.clock[0] += 1.0 / 30
    return paired


@pytest.mark.parametrize('poison_s', [1000.0, 6.0])
def test_one_future_depth_before_the_first_colour_frame_poisons_nothing(poison_s):
    depth, rec, cond = make()
    depth.put(depth_msg(np.full((2, 2), 1500), 10 * SEC + int(poison_s * SEC)))
    assert _frames_with_late_depth(depth, cond, 0, 24) == 24  # e67d60d: 0 of 24
    assert rec.drops == {'depth_stamp_future': 1}
    assert depth.buffered == 0 and _accounted(depth)


def test_one_far_past_depth_moves_no_pairing_state():
    depth, rec, cond = make()
    assert _frames_with_late_depth(depth, cond, 0, 4) == 4
    depth.put(depth_msg(np.full((2, 2), 1500), SEC))  # 9 s before the last frame
    assert _frames_with_late_depth(depth, cond, 4, 8) == 8
    assert rec.drops == {'depth_stamp_stale': 1} and _accounted(depth)


def test_a_depth_stream_that_never_pairs_does_not_hold_colour_frames():
    depth, rec, cond = make(wait_s=0.05)
    waited = []
    for i in range(10):  # the depth camera's clock is 2 s behind: stale on arrival
        stamp = 10 * SEC + i * PERIOD
        depth.note_colour(_stamp(stamp))
        depth.put(depth_msg(np.ones((2, 2)), stamp - 2 * SEC))
        before = cond.waited_s
        assert depth.take(stamp, (2, 2)) is None
        waited.append(cond.waited_s - before)
    assert waited == [0.0] * 10  # e67d60d: 0.05 s each
    # The first came before any frame was processed: passed by it, unpaired; the rest stale.
    assert rec.drops == {'depth_stamp_stale': 9, 'depth_unpaired': 1}
    assert _accounted(depth)


def test_a_live_stream_still_gets_its_wait():
    depth, rec, cond = make(wait_s=0.05)
    depth.put(depth_msg(np.ones((2, 2)), 10 * SEC - PERIOD))
    cond.clock[0] += 0.5
    before = cond.waited_s
    assert depth.take(10 * SEC, (2, 2)) is None  # live, nothing came: the full wait
    assert cond.waited_s - before == pytest.approx(0.05, abs=1e-12)


@pytest.mark.parametrize('value, encoding', [
    (np.inf, '32FC1'), (1e9, '32FC1'), (3e38, '32FC1'), (1e-40, '32FC1'), (-2.0, '32FC1')])
def test_depth_with_no_physical_pixel_is_a_counted_drop(value, encoding):
    depth, rec, _ = make()
    depth.put(depth_msg(np.full((3, 4), value, np.float32), 10 * SEC, encoding))
    assert rec.drops == {'depth_no_valid_pixels': 1} and depth.buffered == 0
    assert _accounted(depth)


def test_max_range_bounds_the_pixels_too():
    depth, rec, _ = make(max_range_m=5.0)
    depth.put(depth_msg(np.full((2, 2), 6.0, np.float32), 10 * SEC, '32FC1'))
    assert rec.drops == {'depth_no_valid_pixels': 1}


def test_the_buffer_is_bounded_in_bytes_and_every_eviction_is_counted():
    one = np.full((100, 100), 1500, np.uint16)  # 40,000 bytes once in metres (float32)
    depth, rec, _ = make(capacity=1000, max_bytes=10 * 40_000)
    for i in range(30):  # depth without colour
        depth.put(depth_msg(one, 10 * SEC + i * PERIOD))
    assert depth.buffered == 10 and depth.buffered_bytes == 10 * 40_000
    assert rec.drops == {'depth_unpaired': 20} and _accounted(depth)
    big = DepthInput(MetricConfig(source='depth'), 1000, rec.count, rec.lines.append,
                     max_bytes=1)  # one image over the bound is still kept: the newest
    big.put(depth_msg(one, 10 * SEC))
    assert big.buffered == 1


def test_the_nodes_depth_buffer_has_the_byte_bound():
    class Stats:
        def count_drop(self, reason: str, detail: str) -> None:
            pass

    class Log:
        def warning(self, line: str) -> None:
            pass

    values = {'metric.source': 'depth', 'input.queue_size': 64, 'input.queue_mode': 'bag',
              'input.qos.depth': 100}
    depth = from_values(values, Stats(), Log())
    assert depth.max_bytes == MAX_BUFFER_BYTES <= 256 * 2**20


def test_hostile_sequence_every_depth_image_ends_in_exactly_one_place():
    rng = np.random.default_rng(3)
    depth, rec, cond = make(capacity=6)
    colour = 10 * SEC
    for step in range(300):
        kind = rng.integers(0, 8)
        stamp = colour + int(rng.integers(-3, 4)) * PERIOD
        if kind == 0:
            depth.put(depth_msg(np.full((2, 2), np.inf, np.float32), stamp, '32FC1'))
        elif kind == 1:
            depth.put(depth_msg(np.ones((2, 2)), stamp + int(rng.choice([-1, 1]) * 1e12)))
        elif kind == 2:
            depth.put(depth_msg(np.ones((3, 3)), stamp))  # another size
        elif kind in (3, 4, 5):
            depth.put(depth_msg(np.ones((2, 2)), stamp))
        else:
            colour += PERIOD
            depth.note_colour(_stamp(colour))
            depth.take(colour, (2, 2))
        assert _accounted(depth), step
    assert set(rec.drops) <= set(DEPTH_DROP_REASONS)
    assert depth.paired_total > 0 and rec.drops['depth_stamp_future'] > 0
