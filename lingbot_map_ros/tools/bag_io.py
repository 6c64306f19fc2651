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
"""Read and write rosbag2 bags (sqlite3 and MCAP) with ``rosbags``, without a ROS install.

Reading keeps the raw CDR bytes next to the connection, so the player can publish them untouched
(``rclpy`` publishes serialized bytes as they are) and the replay tool can deserialize only the
topic it needs. Messages built here are ``rosbags`` dataclasses; the pure functions of
``lingbot_map_ros.ros.messages.conversions`` read them like ``rclpy`` messages (duck typing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cv2
from lingbot_map_ros.ros.messages.conversions import ns_to_sec_nanosec
import numpy as np
from rosbags.interfaces import Connection
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import get_typestore, Stores

IMAGE_TYPE = 'sensor_msgs/msg/Image'
COMPRESSED_TYPE = 'sensor_msgs/msg/CompressedImage'
CAMERA_INFO_TYPE = 'sensor_msgs/msg/CameraInfo'
IMAGE_TYPES = (IMAGE_TYPE, COMPRESSED_TYPE)
Storage = Literal['sqlite3', 'mcap']

# Message definitions of the image types are the same in every ROS 2 distribution.
TYPESTORE = get_typestore(Stores.ROS2_KILTED)
# rosbag2 metadata version 8 is read by Jazzy, Kilted and Rolling.
_BAG_VERSION = 8


class BagError(RuntimeError):
    """A bag that cannot be read as asked (missing, no such topic, wrong message type)."""


class StorageError(BagError):
    """The bag's storage broke while it was being read (e.g. a corrupt sqlite page)."""


class BadMessageError(ValueError):
    """One recorded message cannot be deserialized (truncated or garbage CDR, bad UTF-8)."""


@dataclass(frozen=True)
class TopicInfo:
    """One topic of a bag."""

    name: str
    """Topic name, e.g. ``/camera/image_raw``."""
    msgtype: str
    """ROS type name, e.g. ``sensor_msgs/msg/Image``."""
    num_messages: int
    """Messages recorded on the topic."""


@dataclass(frozen=True)
class RawMessage:
    """One recorded message, still serialized."""

    topic: str
    """Topic it was recorded on."""
    msgtype: str
    """ROS type name."""
    log_time_ns: int
    """Recording (receive) time, nanoseconds; this is the time the player replays."""
    data: bytes
    """CDR bytes."""


@contextmanager
def open_bag(path: str | Path) -> Iterator[Reader]:
    """Open a rosbag2 folder (or its single storage file) for reading; closes it on exit.

    Args:
        path: bag folder with ``metadata.yaml``, or a ``.db3`` / ``.mcap`` file inside it.

    Yields:
        The opened ``rosbags`` reader.

    Raises:
        BagError: the path does not exist or is not a readable rosbag2 bag.
    """
    bag = Path(path)
    if bag.is_file() and bag.suffix in ('.db3', '.mcap'):
        bag = bag.parent
    if not bag.exists():
        raise BagError(f'bag {path} does not exist')
    if not (bag / 'metadata.yaml').is_file():
        raise BagError(f'{path} is not a rosbag2 bag (no metadata.yaml in {bag})')
    reader = Reader(bag)
    try:
        reader.open()
    except Exception as exc:  # rosbags raises several unrelated types for broken bags
        raise BagError(f'cannot open bag {path}: {exc}') from exc
    try:
        yield reader
    finally:
        reader.close()


def list_topics(reader: Reader) -> dict[str, TopicInfo]:
    """List the topics of an opened bag, by name.

    Args:
        reader: an opened reader.

    Returns:
        ``{name: TopicInfo}`` in name order.
    """
    return {name: TopicInfo(name, info.msgtype, info.msgcount)
            for name, info in sorted(reader.topics.items())}


def describe_topics(topics: dict[str, TopicInfo]) -> str:
    """Describe topics, one line each (``name [type] N msgs``), for errors and logs."""
    if not topics:
        return '  (the bag has no topics)'
    return '\n'.join(f'  {t.name} [{t.msgtype}] {t.num_messages} msgs' for t in topics.values())


def require_topic(reader: Reader, topic: str, msgtypes: tuple[str, ...]) -> TopicInfo:
    """Check that ``topic`` is in the bag with one of ``msgtypes``.

    Args:
        reader: an opened reader.
        topic: topic name (a missing leading slash is added).
        msgtypes: accepted type names.

    Returns:
        The topic's :class:`TopicInfo`.

    Raises:
        BagError: no such topic (the message lists the bag's topics) or another type.
    """
    topics = list_topics(reader)
    name = topic if topic.startswith('/') else '/' + topic
    if name not in topics:
        raise BagError(f"topic '{name}' is not in the bag; it has:\n{describe_topics(topics)}")
    info = topics[name]
    if info.msgtype not in msgtypes:
        raise BagError(f"topic '{name}' has type {info.msgtype}; expected "
                       f"{' or '.join(msgtypes)}")
    return info


def read_raw(reader: Reader, topics: list[str] | None = None) -> Iterator[RawMessage]:
    """Yield the messages of ``topics`` (all when None) in recording-time order.

    Args:
        reader: an opened reader.
        topics: topic names to read; unknown names are ignored (check with ``require_topic``).

    Yields:
        :class:`RawMessage` per recorded message.

    Raises:
        StorageError: the storage cannot be read further; the messages before were yielded.
    """
    wanted: list[Connection] = [c for c in reader.connections
                                if topics is None or c.topic in topics]
    if not wanted:
        return
    messages = reader.messages(connections=wanted)
    while True:
        try:
            conn, log_time_ns, data = next(messages)
        except StopIteration:
            return
        except Exception as exc:  # sqlite3 / mcap / rosbags raise unrelated types
            raise StorageError(f'bag storage unreadable: {type(exc).__name__}: {exc}') from exc
        yield RawMessage(conn.topic, conn.msgtype, int(log_time_ns), bytes(data))


def deserialize(message: RawMessage) -> Any:
    """Deserialize a raw message into a ``rosbags`` dataclass (fields as in ``rclpy``).

    Raises:
        BadMessageError: the bytes are not a valid message of its type.
    """
    try:
        return TYPESTORE.deserialize_cdr(message.data, message.msgtype)
    except Exception as exc:  # struct.error, UnicodeDecodeError, IndexError, ... from rosbags
        raise BadMessageError(f'{message.msgtype} at {message.log_time_ns} ns: '
                              f'{type(exc).__name__}: {exc}') from exc


def _header(stamp_ns: int, frame_id: str) -> Any:
    types = TYPESTORE.types
    sec, nanosec = ns_to_sec_nanosec(stamp_ns)
    return types['std_msgs/msg/Header'](
        stamp=types['builtin_interfaces/msg/Time'](sec=sec, nanosec=nanosec), frame_id=frame_id)


def image_message(rgb: np.ndarray, stamp_ns: int, frame_id: str,
                  encoding: Literal['rgb8', 'bgr8'] = 'rgb8') -> Any:
    """Build a ``sensor_msgs/Image`` from an RGB array.

    Args:
        rgb: [H, W, 3] uint8 RGB.
        stamp_ns: header stamp, nanoseconds.
        frame_id: header frame id (the camera optical frame).
        encoding: 'rgb8' or 'bgr8' (channels are swapped for 'bgr8').

    Returns:
        A ``rosbags`` ``sensor_msgs/msg/Image``.
    """
    pixels = rgb if encoding == 'rgb8' else rgb[:, :, ::-1]
    h, w = rgb.shape[:2]
    return TYPESTORE.types[IMAGE_TYPE](
        header=_header(stamp_ns, frame_id), height=h, width=w, encoding=encoding,
        is_bigendian=0, step=3 * w, data=np.ascontiguousarray(pixels).reshape(-1))


def depth_message(depth_m: np.ndarray, stamp_ns: int, frame_id: str) -> Any:
    """Build a ``16UC1`` ``sensor_msgs/Image`` in millimetres (REP 118) from metres.

    Args:
        depth_m: [H, W] depth in metres; NaN, Inf and values <= 0 become 0 (no value),
            values past 65.535 m are clipped.
        stamp_ns: header stamp, nanoseconds.
        frame_id: header frame id (the colour camera's optical frame: aligned depth).

    Returns:
        A ``rosbags`` ``sensor_msgs/msg/Image``.
    """
    metres = np.nan_to_num(np.asarray(depth_m, dtype=np.float64), nan=0.0, posinf=0.0,
                           neginf=0.0)
    mm = np.clip(np.rint(metres * 1000.0), 0, 65535).astype('<u2')
    h, w = mm.shape
    return TYPESTORE.types[IMAGE_TYPE](
        header=_header(stamp_ns, frame_id), height=h, width=w, encoding='16UC1',
        is_bigendian=0, step=2 * w, data=mm.reshape(-1).view(np.uint8))


def compressed_message(rgb: np.ndarray, stamp_ns: int, frame_id: str,
                       jpeg_quality: int = 90) -> Any:
    """Build a JPEG ``sensor_msgs/CompressedImage`` (``image_transport`` format string).

    Args:
        rgb: [H, W, 3] uint8 RGB.
        stamp_ns: header stamp, nanoseconds.
        frame_id: header frame id.
        jpeg_quality: JPEG quality, 1-100.

    Returns:
        A ``rosbags`` ``sensor_msgs/msg/CompressedImage``.
    """
    ok, buf = cv2.imencode('.jpg', cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, int(jpeg_quality)])
    if not ok:
        raise RuntimeError(f'JPEG encoding of a {rgb.shape} image failed')
    return TYPESTORE.types[COMPRESSED_TYPE](
        header=_header(stamp_ns, frame_id), format='rgb8; jpeg compressed bgr8',
        data=buf.reshape(-1))


def camera_info_message(k: np.ndarray, width: int, height: int, stamp_ns: int,
                        frame_id: str) -> Any:
    """Build an undistorted pinhole ``sensor_msgs/CameraInfo``.

    Args:
        k: [3, 3] intrinsic matrix.
        width: image width in pixels.
        height: image height in pixels.
        stamp_ns: header stamp, nanoseconds.
        frame_id: header frame id.

    Returns:
        A ``rosbags`` ``sensor_msgs/msg/CameraInfo`` with ``plumb_bob`` zero distortion.
    """
    k = np.asarray(k, dtype=np.float64)
    p = np.zeros((3, 4))
    p[:, :3] = k
    types = TYPESTORE.types
    roi = types['sensor_msgs/msg/RegionOfInterest'](
        x_offset=0, y_offset=0, height=0, width=0, do_rectify=False)
    return types[CAMERA_INFO_TYPE](
        header=_header(stamp_ns, frame_id), height=height, width=width,
        distortion_model='plumb_bob', d=np.zeros(5), k=k.reshape(-1), r=np.eye(3).reshape(-1),
        p=p.reshape(-1), binning_x=0, binning_y=0, roi=roi)


class BagWriter:
    """Write messages to a new rosbag2 bag; use as a context manager.

    Example::

        with BagWriter(out, 'mcap') as bag:
            bag.write('/camera/image_raw', stamp_ns, image_message(rgb, stamp_ns, 'cam'))
    """

    def __init__(self, path: str | Path, storage: Storage = 'sqlite3') -> None:
        """Prepare a writer for ``path`` (a folder that must not exist yet).

        Args:
            path: output bag folder.
            storage: 'sqlite3' or 'mcap'.

        Raises:
            BagError: ``path`` exists already.
            ValueError: unknown storage name.
        """
        if storage not in ('sqlite3', 'mcap'):
            raise ValueError(f"storage='{storage}' is not one of 'sqlite3', 'mcap'")
        self._path = Path(path)
        if self._path.exists():
            raise BagError(f'output bag {path} exists already; remove it or pick another path')
        plugin = StoragePlugin.MCAP if storage == 'mcap' else StoragePlugin.SQLITE3
        self._writer = Writer(self._path, version=_BAG_VERSION, storage_plugin=plugin)
        self._connections: dict[str, Connection] = {}

    def __enter__(self) -> 'BagWriter':
        """Open the bag."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._writer.open()
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the bag (writes ``metadata.yaml``)."""
        self._writer.close()

    def write(self, topic: str, stamp_ns: int, msg: Any) -> None:
        """Serialize ``msg`` and record it on ``topic`` at ``stamp_ns``.

        Args:
            topic: topic name; its connection is created on first use from the message type.
            stamp_ns: recording time, nanoseconds.
            msg: a ``rosbags`` message dataclass.
        """
        msgtype = msg.__msgtype__
        conn = self._connections.get(topic)
        if conn is None:
            conn = self._writer.add_connection(topic, msgtype, typestore=TYPESTORE)
            self._connections[topic] = conn
        self._writer.write(conn, int(stamp_ns), TYPESTORE.serialize_cdr(msg, msgtype))
