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
"""``lingbot_map_replay play``: publish a bag into a live ROS graph, like ``ros2 bag play``.

For machines without rosbag2 (the PyPI ROS wheels): the recorded CDR bytes are published as they
are (``rclpy`` publishes serialized messages directly), so any message type whose Python package
is importable can be played; by default the bag's Image, CompressedImage and CameraInfo topics.

Timing follows the recording time of each message divided by ``--rate``. With ``--clock`` the
player publishes ``/clock`` (rosgraph_msgs/Clock): once before each message with that message's
recording time, and at ``--clock-hz`` in between, so nodes with ``use_sim_time`` see the bag's
time. Images default to best-effort QoS (the sensor-data convention, what the node subscribes
with by default); ``--reliable`` offers reliable QoS with a deep history, which a node in bag mode
with ``input.qos.reliability: reliable`` needs to receive every frame. ``--wait-for-subscribers``
holds playback until each colour image topic has that many subscribers, so no frame is published
before the node is listening; depth topics (a ``depth`` part in the name) are not waited for,
since a wrong remap would never subscribe them: one without a subscriber is named in a warning.
SIGINT and SIGTERM stop the playback and end the process with status 0.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import importlib
import logging
import signal
import time
from typing import Any

from lingbot_map_ros.ros.messages.conversions import fill_stamp
from lingbot_map_ros.ros.parameters.cli_help import plain
from lingbot_map_ros.tools import bag_io
import rclpy
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from rosgraph_msgs.msg import Clock

_LOG = logging.getLogger(__name__)
DEFAULT_TYPES = bag_io.IMAGE_TYPES + (bag_io.CAMERA_INFO_TYPE,)


@dataclass(frozen=True)
class PlayOptions:
    """How a bag is played."""

    topics: tuple[str, ...] = ()
    """Topics to publish; empty: every Image, CompressedImage and CameraInfo topic."""
    rate: float = 1.0
    """Playback speed factor (2.0 = twice as fast)."""
    clock: bool = False
    """Publish /clock with the bag's time."""
    clock_hz: float = 40.0
    """/clock rate between messages."""
    reliable: bool = False
    """Offer reliable QoS (default: best effort)."""
    qos_depth: int = 100
    """History depth of the publishers."""
    loop: bool = False
    """Start again at the end (the bag time, and /clock, jump back)."""
    delay_s: float = 0.0
    """Wait this long before the first message."""
    wait_for_subscribers: int = 0
    """Hold playback until every image topic has this many subscribers."""
    wait_timeout_s: float = 30.0
    """Longest wait for subscribers."""

    def __post_init__(self) -> None:
        """Reject out-of-range values."""
        if self.rate <= 0:
            raise ValueError(f'--rate must be > 0, got {self.rate}')
        if self.clock_hz <= 0:
            raise ValueError(f'--clock-hz must be > 0, got {self.clock_hz}')


def message_class(msgtype: str) -> Any:
    """Import the ``rclpy`` message class of a ROS type name ('sensor_msgs/msg/Image').

    Raises:
        bag_io.BagError: the type's Python package is not installed.
    """
    package, _, name = msgtype.rpartition('/')
    try:
        return getattr(importlib.import_module(package.replace('/', '.')), name)
    except (ImportError, AttributeError) as exc:
        raise bag_io.BagError(f'cannot play {msgtype}: its Python message package is not '
                              f'installed ({exc})') from exc


def select_topics(topics: dict[str, bag_io.TopicInfo],
                  wanted: tuple[str, ...]) -> list[bag_io.TopicInfo]:
    """Pick the topics to play.

    Raises:
        bag_io.BagError: a requested topic is not in the bag, or nothing to play.
    """
    if wanted:
        names = [t if t.startswith('/') else '/' + t for t in wanted]
        missing = [n for n in names if n not in topics]
        if missing:
            raise bag_io.BagError(f'topic(s) {", ".join(missing)} not in the bag; it has:\n'
                                  f'{bag_io.describe_topics(topics)}')
        return [topics[n] for n in names]
    chosen = [t for t in topics.values() if t.msgtype in DEFAULT_TYPES]
    if not chosen:
        raise bag_io.BagError('the bag has no Image, CompressedImage or CameraInfo topic; '
                              f'name topics with --topics:\n{bag_io.describe_topics(topics)}')
    return chosen


class BagPlayer:
    """Publishes the messages of an opened bag on a node's publishers, in recorded time."""

    def __init__(self, node: Node, reader: Any, options: PlayOptions) -> None:
        """Create one publisher per played topic (and /clock).

        Args:
            node: the node that owns the publishers (the caller spins it if it needs to).
            reader: an opened ``rosbags`` reader (see ``bag_io.open_bag``).
            options: what and how to play.

        Raises:
            bag_io.BagError: see :func:`select_topics` and :func:`message_class`.
        """
        self._node = node
        self._reader = reader
        self._options = options
        self.topics = select_topics(bag_io.list_topics(reader), options.topics)
        qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST, depth=options.qos_depth,
            reliability=ReliabilityPolicy.RELIABLE if options.reliable
            else ReliabilityPolicy.BEST_EFFORT)
        self._pubs = {t.name: node.create_publisher(message_class(t.msgtype), t.name, qos)
                      for t in self.topics}
        # Reliable /clock matches both reliable and best-effort clock subscriptions.
        self._clock_pub = node.create_publisher(
            Clock, '/clock', QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)) \
            if options.clock else None
        self.num_published = 0

    def wait_for_subscribers(self, count: int, timeout_s: float) -> bool:
        """Wait until each colour image topic has ``count`` subscribers.

        Depth topics are not waited for (see the module docstring); each without a subscriber
        once the colour topics have theirs is named in a warning.

        Returns:
            True when they are there, False after ``timeout_s``.
        """
        images = [t.name for t in self.topics if t.msgtype in bag_io.IMAGE_TYPES]
        colour = [n for n in images if not is_depth_topic(n)]
        deadline = time.monotonic() + timeout_s
        while any(self._pubs[n].get_subscription_count() < count for n in colour):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        for name in images:
            if is_depth_topic(name) and self._pubs[name].get_subscription_count() == 0:
                _LOG.warning('%s has no subscriber (a depth remap missing?); playing anyway',
                             name)
        return True

    def play(self) -> int:
        """Publish every selected message in recorded time (forever with ``loop``).

        Returns:
            Number of messages published.
        """
        opts = self._options
        if opts.wait_for_subscribers and \
                not self.wait_for_subscribers(opts.wait_for_subscribers, opts.wait_timeout_s):
            _LOG.warning('not every colour image topic has %d subscriber(s) after %.0f s; playing '
                         'anyway', opts.wait_for_subscribers, opts.wait_timeout_s)
        time.sleep(opts.delay_s)
        names = [t.name for t in self.topics]
        while True:
            self._play_once(names)
            if not opts.loop or not rclpy.ok(context=self._node.context):
                self._wait_for_acks()
                return self.num_published

    def _wait_for_acks(self, timeout_s: float = 10.0) -> None:
        """With reliable QoS, wait until subscribers acknowledged every message.

        Without this, a player that exits right after its last publish can take the newest
        messages with it before a slow (loaded) subscriber has received them.
        """
        if not self._options.reliable:
            return
        for name, pub in self._pubs.items():
            if not pub.wait_for_all_acked(Duration(nanoseconds=int(timeout_s * 1e9))):
                _LOG.warning('%s: not every subscriber acknowledged the last messages within '
                             '%.0f s', name, timeout_s)

    def _play_once(self, names: list[str]) -> None:
        start_wall = time.monotonic()
        start_bag: int | None = None
        for raw in bag_io.read_raw(self._reader, names):
            if not rclpy.ok(context=self._node.context):
                return
            if start_bag is None:
                start_bag = raw.log_time_ns
            target = start_wall + (raw.log_time_ns - start_bag) * 1e-9 / self._options.rate
            self._wait_until(target, start_wall, start_bag)
            self._publish_clock(raw.log_time_ns)
            self._pubs[raw.topic].publish(raw.data)
            self.num_published += 1

    def _wait_until(self, target: float, start_wall: float, start_bag: int) -> None:
        """Sleep until ``target`` (monotonic s), ticking /clock at ``clock_hz``."""
        period = 1.0 / self._options.clock_hz
        while True:
            now = time.monotonic()
            if now >= target:
                return
            time.sleep(min(period, target - now))
            if self._clock_pub is not None and time.monotonic() < target:
                elapsed = (time.monotonic() - start_wall) * self._options.rate
                self._publish_clock(start_bag + int(elapsed * 1e9))

    def _publish_clock(self, stamp_ns: int) -> None:
        if self._clock_pub is not None:
            msg = Clock()
            fill_stamp(msg.clock, stamp_ns)
            self._clock_pub.publish(msg)


def is_depth_topic(name: str) -> bool:
    """Return True for a depth image topic: one part of its name starts with ``depth``."""
    return any(part.startswith('depth') for part in name.split('/'))


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``play`` subcommand to the replay CLI."""
    p = subparsers.add_parser(
        'play', help='publish a bag into the ROS graph with its recorded timing (and /clock)',
        description=plain(__doc__.split('\n\n', 1)[1]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('bag', help='rosbag2 folder (sqlite3 or MCAP)')
    p.add_argument('--topics', nargs='+', default=[],
                   help='topics to play (default: every Image, CompressedImage, CameraInfo)')
    p.add_argument('--rate', type=float, default=1.0,
                   help='speed factor of the playback (default: %(default)s)')
    p.add_argument('--clock', action='store_true',
                   help='publish /clock with the bag time (for use_sim_time)')
    p.add_argument('--clock-hz', type=float, default=40.0,
                   help='/clock rate between messages (default: %(default)s)')
    p.add_argument('--reliable', action='store_true',
                   help='offer reliable QoS instead of best effort (the node in bag mode)')
    p.add_argument('--qos-depth', type=int, default=100,
                   help='publisher history depth (default: %(default)s)')
    p.add_argument('--loop', action='store_true', help='play again from the start at the end')
    p.add_argument('--delay', type=float, default=0.0,
                   help='seconds to wait before the first message (default: %(default)s)')
    p.add_argument('--wait-for-subscribers', type=int, default=0, metavar='N',
                   help='hold playback until every colour image topic has N subscribers '
                        '(depth topics are not waited for)')
    p.add_argument('--wait-timeout', type=float, default=30.0,
                   help='longest wait for subscribers in seconds (default: %(default)s)')
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``play``; returns the exit code."""
    options = PlayOptions(
        topics=tuple(args.topics), rate=args.rate, clock=args.clock, clock_hz=args.clock_hz,
        reliable=args.reliable, qos_depth=args.qos_depth, loop=args.loop, delay_s=args.delay,
        wait_for_subscribers=args.wait_for_subscribers, wait_timeout_s=args.wait_timeout)
    # Explicit init/shutdown: Jazzy's rclpy.init() returns None, so it is no context manager.
    # rclpy's own handlers would shut the context down under a publish (an RCLError traceback on
    # SIGTERM); ours end the playback between two messages instead.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    player = None
    start = time.monotonic()
    try:
        with bag_io.open_bag(args.bag) as reader:
            rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
            try:
                node = Node('lingbot_map_player')
                try:
                    player = BagPlayer(node, reader, options)
                    _LOG.info('playing %s at rate %g%s:\n%s', args.bag, options.rate,
                              ' with /clock' if options.clock else '',
                              bag_io.describe_topics({t.name: t for t in player.topics}))
                    player.play()
                finally:
                    node.destroy_node()
            finally:
                rclpy.try_shutdown()
    except KeyboardInterrupt:
        _LOG.info('stopped by a signal')
    finally:
        signal.signal(signal.SIGTERM, previous)
    if player is not None:
        _LOG.info('published %d messages in %.1f s', player.num_published,
                  time.monotonic() - start)
    return 0


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
