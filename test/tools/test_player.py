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
"""``lingbot_map_replay play``: a bag published into a real rclpy graph, with timing and /clock.

Run: ``pytest test/tools/test_player.py`` (about 10 s on 2 cores; marker ``rostest``). Uses a
private DDS domain.

Checks what a subscriber receives: every image and camera_info, in order, byte-identical
pixels and stamps; /clock never going back and published at each message's stamp;
the playback duration following ``--rate``; best-effort vs reliable QoS matching; the CLI.
"""

import os
import random
import subprocess
import sys
import threading
import time

from lingbot_map_ros.ros.messages.conversions import image_msg_to_rgb, stamp_to_ns
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.make_bag import BagSpec, write_frames
from lingbot_map_ros.tools.player import BagPlayer, PlayOptions
import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CameraInfo, Image

pytestmark = pytest.mark.rostest

os.environ.setdefault('ROS_DOMAIN_ID', str(random.randint(100, 199)))
os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')

NUM = 6
START_NS = 1_000 * 1_000_000_000
STEP_NS = 100_000_000  # 10 fps
K = np.array([[40.0, 0.0, 16.0], [0.0, 40.0, 12.0], [0.0, 0.0, 1.0]])


def _frames() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, 255, (24, 32, 3), dtype=np.uint8) for _ in range(NUM)]


@pytest.fixture(scope='module')
def bag(tmp_path_factory):
    path = tmp_path_factory.mktemp('player') / 'bag'
    write_frames(BagSpec(out=path), _frames(), K, fps=10.0, start_ns=START_NS)
    return path


class Listener:
    """A node in its own context that records images, camera_info and /clock in arrival order."""

    def __init__(self, reliable: bool) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = Node('player_listener', context=self.context)
        self.events: list[tuple[str, object]] = []
        self.lock = threading.Lock()
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE if reliable
                         else ReliabilityPolicy.BEST_EFFORT)
        for kind, msg_type, topic in (('image', Image, '/camera/image_raw'),
                                      ('info', CameraInfo, '/camera/camera_info'),
                                      ('clock', Clock, '/clock')):
            self.node.create_subscription(msg_type, topic, self._recorder(kind), qos)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        threading.Thread(target=self.executor.spin, daemon=True).start()

    def _recorder(self, kind):
        def record(msg):
            with self.lock:
                self.events.append((kind, msg))
        return record

    def of(self, kind):
        with self.lock:
            return [m for k, m in self.events if k == kind]

    def wait(self, kind, count, timeout_s=20.0):
        deadline = time.monotonic() + timeout_s
        while len(self.of(kind)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.of(kind)

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()
        self.context.try_shutdown()


@pytest.fixture
def listener():
    made = []

    def make(reliable=False):
        made.append(Listener(reliable))
        return made[-1]
    yield make
    for item in made:
        item.close()


def test_plays_every_message_in_order_with_clock_and_rate(bag, listener):
    sub = listener(reliable=False)
    node = Node('player_under_test', context=sub.context)
    try:
        with bag_io.open_bag(bag) as reader:
            player = BagPlayer(node, reader, PlayOptions(rate=2.0, clock=True, clock_hz=50.0,
                                                         wait_for_subscribers=1))
            start = time.monotonic()
            assert player.play() == 2 * NUM
            elapsed = time.monotonic() - start
    finally:
        node.destroy_node()
    images = sub.wait('image', NUM)
    infos = sub.wait('info', NUM)
    stamps = [START_NS + i * STEP_NS for i in range(NUM)]
    assert [stamp_to_ns(m.header.stamp) for m in images] == stamps
    assert [stamp_to_ns(m.header.stamp) for m in infos] == stamps
    for msg, rgb in zip(images, _frames()):
        np.testing.assert_array_equal(image_msg_to_rgb(msg), rgb)
    np.testing.assert_array_equal(np.reshape(infos[0].k, (3, 3)), K)
    # 0.5 s of bag time at rate 2 (plus discovery wait, which precedes the timed part).
    assert 0.24 <= elapsed < 3.0
    with sub.lock:
        events = list(sub.events)
    clock = [stamp_to_ns(m.clock) for k, m in events if k == 'clock']
    assert clock == sorted(clock) and clock[0] == START_NS and clock[-1] == stamps[-1]
    # Ticks between messages (50 Hz wall = 40 ms bag time at rate 2): more clocks than frames.
    assert len(clock) > NUM + 3
    # /clock is published at each message's stamp before the message (delivery order across
    # topics is not guaranteed, so only the values are checked).
    assert set(stamps) <= set(clock)


def test_best_effort_does_not_match_a_reliable_subscriber(bag, listener):
    sub = listener(reliable=True)
    node = Node('player_qos', context=sub.context)
    try:
        with bag_io.open_bag(bag) as reader:
            best_effort = BagPlayer(node, reader, PlayOptions(topics=('/camera/image_raw',)))
            reliable = BagPlayer(node, reader, PlayOptions(topics=('camera/image_raw',),
                                                           reliable=True))
            assert reliable.wait_for_subscribers(1, 10.0)
            assert not best_effort.wait_for_subscribers(1, 0.5)
    finally:
        node.destroy_node()


def test_topic_errors(bag, listener):
    sub = listener()
    node = Node('player_errors', context=sub.context)
    try:
        with bag_io.open_bag(bag) as reader:
            with pytest.raises(bag_io.BagError, match='/camera/camera_info'):
                BagPlayer(node, reader, PlayOptions(topics=('/missing',)))
    finally:
        node.destroy_node()
    with pytest.raises(ValueError, match='--rate'):
        PlayOptions(rate=0.0)


def test_cli_play(bag, listener, tmp_path):
    sub = listener(reliable=True)
    cmd = [sys.executable, '-m', 'lingbot_map_ros.tools.replay', 'play', str(bag), '--rate',
           '4', '--reliable', '--wait-for-subscribers', '1', '--topics', '/camera/image_raw']
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 'published 6 messages' in done.stderr
    images = sub.wait('image', NUM)
    assert [stamp_to_ns(m.header.stamp) for m in images] == \
        [START_NS + i * STEP_NS for i in range(NUM)]
    assert sub.of('info') == []
    missing = subprocess.run([sys.executable, '-m', 'lingbot_map_ros.tools.replay', 'play',
                              str(tmp_path / 'nope')], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 1 and 'does not exist' in missing.stderr
