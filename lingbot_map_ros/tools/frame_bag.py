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
"""A camera's frames written to a new rosbag2 bag: where and how (:class:`BagSpec`), one frame.

Each frame is its image (raw ``sensor_msgs/Image`` or a JPEG ``CompressedImage`` on
``<topic>/compressed``), a ``CameraInfo`` with the same stamp and, when given, its depth just
before them (``16UC1`` millimetres). ``make_bag.py`` (one camera) and ``synthetic_rig.py`` (a
rig, one spec per camera into one bag) write through here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
import logging
from pathlib import Path
from typing import Any

from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.synthetic_scene import pinhole_intrinsics
import numpy as np
from tqdm import tqdm

_LOG = logging.getLogger(__name__)
DEFAULT_TOPIC = '/camera/image_raw'
DEFAULT_START_NS = 1_700_000_000 * 1_000_000_000


@dataclass(frozen=True)
class BagSpec:
    """Where and how a bag is written."""

    out: Path
    """Output bag folder (must not exist)."""
    storage: bag_io.Storage = 'sqlite3'
    """rosbag2 storage plugin: 'sqlite3' or 'mcap'."""
    topic: str = DEFAULT_TOPIC
    """Raw image topic; compressed images go to ``<topic>/compressed``."""
    info_topic: str = ''
    """CameraInfo topic; empty: ``camera_info`` beside the image topic."""
    frame_id: str = 'camera_optical_frame'
    """``header.frame_id`` of every message."""
    compressed: bool = False
    """Write JPEG CompressedImage instead of raw Image."""
    encoding: str = 'rgb8'
    """Raw image encoding: 'rgb8' or 'bgr8'."""
    depth_topic: str = ''
    """Topic of the 16UC1 depth images (synthetic scene); empty: none written."""

    @property
    def image_topic(self) -> str:
        """Topic the images are written on."""
        return f'{self.topic}/compressed' if self.compressed else self.topic

    @property
    def camera_info_topic(self) -> str:
        """Topic the CameraInfo messages are written on."""
        return self.info_topic or f'{self.topic.rsplit("/", 1)[0]}/camera_info'


def write_frames(spec: BagSpec, frames: Iterable[np.ndarray], k: np.ndarray | None,
                 fps: float, start_ns: int = DEFAULT_START_NS, hfov_deg: float = 70.0,
                 total: int | None = None, depths: Iterable[np.ndarray] | None = None,
                 extra: Iterable[tuple[str, int, Any]] = ()) -> int:
    """Write RGB frames (and one CameraInfo per frame) to a new bag.

    Args:
        spec: output bag, topics and format.
        frames: [H, W, 3] uint8 RGB images, all of one size.
        k: [3, 3] intrinsics, or None for the pinhole guess from ``hfov_deg``.
        fps: frame rate that sets the stamps.
        start_ns: stamp of the first frame.
        hfov_deg: horizontal field of view of the guess.
        total: number of frames, for the progress bar.
        depths: [H, W] metres per frame, written on ``spec.depth_topic`` (needs it set).
        extra: ``(topic, stamp_ns, message)`` of other sensors (the synthetic IMU), written
            after the frames (readers order a bag by recording time).

    Returns:
        Number of frames written.

    Raises:
        ValueError: no frames, or frames of different sizes.
    """
    count, size = 0, None
    depth_iter = iter(depths) if depths is not None else None
    if depth_iter is not None and not spec.depth_topic:
        raise ValueError('depth images need a depth topic')
    with bag_io.BagWriter(spec.out, spec.storage) as bag:
        for rgb in tqdm(frames, total=total, desc='writing', unit='frame', leave=False):
            h, w = rgb.shape[:2]
            if size is None:
                size = (h, w)
                k = pinhole_intrinsics(w, h, hfov_deg) if k is None else k
            elif size != (h, w):
                raise ValueError(f'frame {count} is {w}x{h}, the first was {size[1]}x{size[0]}')
            stamp = start_ns + int(round(count * 1e9 / fps))
            write_frame(bag, spec, rgb, k, stamp,
                        None if depth_iter is None else next(depth_iter))
            count += 1
        for topic, stamp, msg in extra:
            bag.write(topic, stamp, msg)
    if count == 0:
        raise ValueError('no frames to write')
    _LOG.info('wrote %d frames to %s (%s on %s, camera_info on %s)', count, spec.out,
              'CompressedImage' if spec.compressed else 'Image', spec.image_topic,
              spec.camera_info_topic)
    if depth_iter is not None:
        _LOG.info('wrote the depth images (16UC1, mm) on %s', spec.depth_topic)
    return count


def write_frame(bag: bag_io.BagWriter, spec: BagSpec, rgb: np.ndarray, k: np.ndarray,
                stamp: int, depth: np.ndarray | None = None) -> None:
    """Write one frame: its depth first (when given), the image, its CameraInfo."""
    h, w = rgb.shape[:2]
    if depth is not None:
        bag.write(spec.depth_topic, stamp, bag_io.depth_message(depth, stamp, spec.frame_id))
    if spec.compressed:
        msg = bag_io.compressed_message(rgb, stamp, spec.frame_id)
    else:
        msg = bag_io.image_message(rgb, stamp, spec.frame_id, spec.encoding)
    bag.write(spec.image_topic, stamp, msg)
    bag.write(spec.camera_info_topic, stamp,
              bag_io.camera_info_message(k, w, h, stamp, spec.frame_id))
