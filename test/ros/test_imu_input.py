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
"""The IMU input: conversion, every bad reading dropped and counted, and the real subscription.

Run: ``python -m pytest test/ros/test_imu_input.py`` (a few seconds; one rclpy graph).
"""

from __future__ import annotations

import math

from lingbot_map_ros.config import ImuConfig
from lingbot_map_ros.ros.inference.imu_input import ImuInput, subscribe
from node_harness import wait_for
import numpy as np
import pytest
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Imu

SEC = 1_000_000_000
G = 9.80665


def imu_msg(stamp_s: float, gyro=(0.0, 0.0, 0.1), accel=(0.0, 0.0, G),
            frame_id: str = 'imu_link') -> Imu:
    """Build a ``sensor_msgs/Imu`` (floats are passed through as they are, NaN included)."""
    msg = Imu()
    msg.header.frame_id = frame_id
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(round(stamp_s * SEC)), SEC)
    msg.angular_velocity.x, msg.angular_velocity.y, msg.angular_velocity.z = map(float, gyro)
    (msg.linear_acceleration.x, msg.linear_acceleration.y,
     msg.linear_acceleration.z) = map(float, accel)
    return msg


class Warnings:
    """Keeps the warnings logged."""

    def __init__(self) -> None:
        """Start empty."""
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        """Keep one line."""
        self.lines.append(line)


def make(**values) -> tuple[ImuInput, Warnings]:
    """Return an input of ``imu.*`` values (topic 'imu') and its warnings."""
    warn = Warnings()
    return ImuInput(ImuConfig(topic='imu', **values), warn, clock=lambda: 0.0), warn


def test_good_readings_are_kept_on_the_camera_clock() -> None:
    """Readings convert to rad/s and m/s^2 and move by the time offset."""
    imu, warn = make(time_offset_s=0.002)
    for i in range(200):
        assert imu.put(imu_msg(100.0 + i / 200.0, gyro=(0.1, -0.2, 0.3))) is None
    stamps, gyro, accel = imu.window(100.2, 100.5)
    assert stamps[0] == pytest.approx(100.198, abs=1e-6)  # IMU stamp 100.2 less the offset
    np.testing.assert_allclose(gyro[0], [0.1, -0.2, 0.3])
    np.testing.assert_allclose(accel[0], [0.0, 0.0, G])
    status = imu.status()
    assert status['accepted'] == status['received'] == 200
    assert status['rate_hz'] == pytest.approx(200.0, rel=1e-3)
    assert status['frame_id'] == 'imu_link' and not warn.lines
    assert sum(status['drops'].values()) == 0


def test_every_bad_reading_is_dropped_counted_and_logged() -> None:
    """NaN/inf, out of order, future, saturated, wrong frame, unmeasured, zero stamp."""
    imu, warn = make()
    for i in range(10):
        imu.put(imu_msg(100.0 + i / 200.0))
    imu.note_image(100.05)
    last = 100.0 + 9 / 200.0
    bad = [imu_msg(last + 0.005, gyro=(math.nan, 0.0, 0.0)),
           imu_msg(last + 0.005, accel=(0.0, math.inf, G)),
           imu_msg(last - 0.02),
           imu_msg(last),
           imu_msg(last + 30.0),
           imu_msg(last + 0.005, gyro=(0.0, 40.0, 0.0)),
           imu_msg(last + 0.005, accel=(0.0, 0.0, 16.0 * G)),
           imu_msg(last + 0.005, frame_id='other_imu'),
           imu_msg(0.0)]
    unmeasured = imu_msg(last + 0.005)
    unmeasured.angular_velocity_covariance[0] = -1.0
    bad.append(unmeasured)
    reasons = [imu.put(msg) for msg in bad]
    assert reasons == ['non_finite', 'non_finite', 'out_of_order', 'out_of_order', 'future',
                       'saturated', 'saturated', 'wrong_frame', 'bad_message', 'bad_message']
    status = imu.status()
    assert status['drops'] == {'non_finite': 2, 'out_of_order': 2, 'future': 1, 'saturated': 2,
                               'wrong_frame': 1, 'bad_message': 2}
    assert status['received'] == 20 and status['accepted'] == 10
    # One WARN per reason while the throttle holds (the clock here never moves).
    assert len(warn.lines) == 6
    assert any('wrong_frame' in line and "'other_imu'" in line for line in warn.lines)
    # The stream goes on after the garbage.
    assert imu.put(imu_msg(last + 0.005)) is None


def test_not_a_message_is_a_counted_drop() -> None:
    """Something without the Imu fields is a bad_message, never an exception."""
    imu, _ = make()
    assert imu.put(object()) == 'bad_message'
    assert imu.status()['drops']['bad_message'] == 1


def test_configured_frame_is_required_from_the_first_message() -> None:
    """With imu.frame_id set, even the first message of another frame is dropped."""
    imu, _ = make(frame_id='imu_link')
    assert imu.put(imu_msg(1.0, frame_id='camera_imu')) == 'wrong_frame'
    assert imu.put(imu_msg(1.005)) is None


def test_future_before_any_image_uses_the_clock() -> None:
    """Before the first image the node's clock is the future reference."""
    warn = Warnings()
    imu = ImuInput(ImuConfig(topic='imu'), warn, now=lambda: 50.0)
    assert imu.put(imu_msg(60.0)) == 'future'
    assert imu.put(imu_msg(50.2)) is None


def test_slow_and_silent_streams_pause_with_a_warning() -> None:
    """A 5 Hz stream is slow, a stopped one silent: each state change WARNs once."""
    imu, warn = make()
    for i in range(20):
        imu.put(imu_msg(10.0 + i / 5.0))
    assert imu.state(14.0) == 'slow'
    assert imu.state(14.1) == 'slow'
    assert imu.state(30.0) == 'silent'
    assert len(warn.lines) == 2
    assert 'slow' in warn.lines[0] and 'paused' in warn.lines[0]
    assert 'silent' in warn.lines[1]
    fast, _ = make()
    for i in range(400):
        fast.put(imu_msg(10.0 + i / 200.0))
    assert fast.state(12.0) == 'ok'


def test_an_imu_that_never_starts_warns_once_while_images_arrive() -> None:
    """Images for longer than the silence span and no reading: one WARN, one pause, silent."""
    imu, warn = make()
    imu.note_image(100.0)
    imu.note_image(100.5)
    assert imu.state(100.5) == 'waiting' and not warn.lines
    for i in range(2, 40):  # 10 fps for almost 4 s: never one line per frame
        imu.note_image(100.0 + i / 10.0)
    assert len(warn.lines) == 1, warn.lines
    assert 'silent' in warn.lines[0] and 'not started' in warn.lines[0]
    assert "'imu'" in warn.lines[0] and 'paused' in warn.lines[0]
    status = imu.status()
    assert status['state'] == 'silent' and status['pauses'] == 1


def test_an_imu_that_stops_warns_once_and_its_return_is_logged() -> None:
    """A stopped stream: one WARN on entering silent, one INFO when readings come back."""
    infos = Warnings()
    warn = Warnings()
    imu = ImuInput(ImuConfig(topic='imu'), warn, clock=lambda: 0.0, info=infos)
    readings = iter(np.arange(10.0, 16.0, 0.005))
    stamp = next(readings)
    for frame in range(60):  # 6 s of images; the readings stop from 12 s to 14 s
        t = 10.0 + frame / 10.0
        while stamp <= t + 1e-9:
            if not 12.0 < stamp < 14.0:
                imu.put(imu_msg(stamp))
            stamp = next(readings)
        imu.note_image(t)
        if frame == 40:  # one reading back: its rate is not known yet, not 'slow'
            assert imu.status()['state'] == 'silent' and len(imu.buffer) > 1
    assert len(warn.lines) == 1, warn.lines
    assert 'silent' in warn.lines[0] and 'stopped' in warn.lines[0]
    assert len(infos.lines) == 1 and 'resumed' in infos.lines[0], infos.lines
    status = imu.status()
    assert status['state'] == 'ok' and status['pauses'] == 1
    # The stop is a gap, not drops.
    assert sum(status['drops'].values()) == 0


def test_a_5_hz_imu_warns_slow_once_over_many_images() -> None:
    """A 5 Hz stream beside 10 fps images: one WARN (slow), the fusion paused, one pause."""
    imu, warn = make()
    for frame in range(50):
        t = 10.0 + frame / 10.0
        if frame % 2 == 0:
            imu.put(imu_msg(t))
        imu.note_image(t)
    assert len(warn.lines) == 1, warn.lines
    assert 'slow' in warn.lines[0] and '5.0 Hz' in warn.lines[0]
    assert imu.state(14.9) == 'slow' and imu.status()['pauses'] == 1


def test_subscription_takes_readings_with_sensor_data_qos(graph) -> None:
    """A real publisher (sensor-data QoS) reaches the input through ``subscribe``."""
    imu, _ = make()
    node = graph.add(Node('imu_input_test', context=graph.context))
    subs = subscribe(node, imu)
    assert len(subs) == 1 and subs[0].topic_name == '/imu'
    assert subscribe(node, None) == []
    pub = node.create_publisher(Imu, 'imu', qos_profile_sensor_data)
    wait_for(lambda: pub.get_subscription_count() > 0, 10.0, 'the IMU subscription')
    stamp = 1000.0

    def sent() -> int:
        nonlocal stamp
        for _ in range(10):
            stamp += 0.005
            pub.publish(imu_msg(stamp))
        pub.publish(imu_msg(stamp + 0.001, gyro=(math.nan, 0.0, 0.0)))
        return imu.status()['accepted'] >= 50 and imu.status()['drops']['non_finite'] >= 1

    wait_for(sent, 20.0, 'readings through the subscription')
    status = imu.status()
    assert status['received'] == status['accepted'] + sum(status['drops'].values())
    graph.remove(node)
