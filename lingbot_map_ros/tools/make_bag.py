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
"""``lingbot_map_replay make-bag``: a rosbag2 bag from images, a video or the synthetic scene.

Every frame is written as ``sensor_msgs/Image`` (``rgb8`` or ``bgr8``) on ``--topic``, or as a JPEG
``sensor_msgs/CompressedImage`` on ``<topic>/compressed`` (the ``image_transport`` name) with
``--compressed``, plus a ``sensor_msgs/CameraInfo`` with the same stamp on ``--info-topic``
(default: ``camera_info`` beside the image topic). Stamps start at ``--start-sec`` and step by
``1 / fps``; the recording time of each message equals its header stamp.

The intrinsics come from ``--fx/--fy/--cx/--cy`` when given, else from a pinhole guess with a
``--hfov-deg`` horizontal field of view and the principal point at the image centre; the
synthetic scene writes its exact intrinsics. ``--synthetic`` also writes the ground truth of the
camera as a TUM file (``--gt``, default ``<bag>_gt.tum``) in the map axes the node publishes;
with ``--depth`` also its exact depth, as a depth camera aligned to the colour image would
publish it (``16UC1`` millimetres, REP 118) on ``--depth-topic`` (default ``depth/image_raw``
beside the image topic), each one just before the colour image of the same stamp. With ``--imu``
also the route's IMU (``tools/synthetic_imu.py``: 200 Hz ``sensor_msgs/Imu`` from the exact
trajectory, with noise and bias, optionally a time offset) on ``--imu-topic`` (default ``imu``
beside the image topic; with ``--cameras N`` one IMU, the primary's, camera 0's, on
``/cam_0/imu``), and its truth (mounting, gravity in the map axes) as ``<bag>_imu.json``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
import logging
from pathlib import Path
from typing import Any

import cv2
from lingbot_map_ros.ros.messages.conversions import map_axes_transform
from lingbot_map_ros.ros.parameters.cli_help import plain
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.frame_bag import BagSpec, DEFAULT_START_NS, DEFAULT_TOPIC, write_frames
from lingbot_map_ros.tools.synthetic_imu import (
    bag_messages, DEFAULT_FRAME_ID, ImuNoise, NOISELESS, synthetic_imu, write_truth)
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig, SyntheticSequence
from lingbot_map_ros.tools.trajectory import Trajectory, write_tum
import numpy as np

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImuSpec:
    """The synthetic IMU to write with the frames (``--imu``)."""

    topic: str
    """sensor_msgs/Imu topic."""
    truth: Path
    """JSON file of its mounting, gravity, time offset and noise."""
    rate_hz: float = 200.0
    """Reading rate (a whole multiple of the frame rate)."""
    time_offset_s: float = 0.0
    """IMU clock minus camera clock."""
    noise: ImuNoise = ImuNoise()
    """White noise and biases."""
    frame_id: str = DEFAULT_FRAME_ID
    """Frame of the readings."""


IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp')


def _resized(rgb: np.ndarray, width: int | None) -> np.ndarray:
    if not width or rgb.shape[1] == width:
        return rgb
    height = int(round(rgb.shape[0] * width / rgb.shape[1]))
    return cv2.resize(rgb, (width, height), interpolation=cv2.INTER_AREA)


def image_files(folder: str | Path) -> list[Path]:
    """List the image files of a folder in name order.

    Raises:
        ValueError: not a folder, or no image files in it.
    """
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f'--images {folder} is not a folder')
    files = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f'no images ({", ".join(IMAGE_SUFFIXES)}) in {folder}')
    return files


def folder_frames(files: list[Path], width: int | None) -> Iterator[np.ndarray]:
    """Read image files as RGB (optionally resized to ``width``)."""
    for path in files:
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f'cannot read image {path}')
        yield _resized(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), width)


def video_frames(path: str | Path, stride: int, max_frames: int | None,
                 width: int | None) -> Iterator[np.ndarray]:
    """Decode every ``stride``-th frame of a video as RGB."""
    capture = cv2.VideoCapture(str(path))
    try:
        index = kept = 0
        while max_frames is None or kept < max_frames:
            ok, bgr = capture.read()
            if not ok:
                break
            if index % stride == 0:
                kept += 1
                yield _resized(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), width)
            index += 1
    finally:
        capture.release()


def video_fps(path: str | Path) -> float:
    """Return the frame rate a video declares (0 when unknown).

    Raises:
        ValueError: the file cannot be opened as a video.
    """
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise ValueError(f'cannot open video {path}')
        return float(capture.get(cv2.CAP_PROP_FPS) or 0.0)
    finally:
        capture.release()


def imu_messages(scene: SceneConfig, imu: ImuSpec | None
                 ) -> tuple[Any, list[tuple[str, int, Any]]]:
    """Return the route's IMU readings and their bag messages (None and [] without ``imu``)."""
    if imu is None:
        return None, []
    readings = synthetic_imu(scene, imu.rate_hz, imu.noise, scene.seed, imu.time_offset_s)
    return readings, list(bag_messages(readings, imu.topic, imu.frame_id, imu.noise,
                                       imu.rate_hz))


def write_imu_truth(imu: ImuSpec | None, readings: Any, map_axes: str, count: int) -> None:
    """Write the IMU's truth file (nothing without ``imu``) and log what was written."""
    if imu is None:
        return
    write_truth(imu.truth, readings, map_axes_transform(map_axes), imu.topic, imu.frame_id,
                imu.noise, imu.rate_hz)
    _LOG.info('wrote %d IMU readings on %s (%g Hz) and their truth %s', count, imu.topic,
              imu.rate_hz, imu.truth)


def write_synthetic(spec: BagSpec, scene: SceneConfig, gt_path: str | Path,
                    map_axes: str = 'flu', seq: SyntheticSequence | None = None,
                    imu: ImuSpec | None = None) -> int:
    """Render the synthetic loop into a bag and write its ground truth.

    Args:
        spec: output bag, topics and format.
        scene: size, length, frame rate and seed of the scene.
        gt_path: output TUM file of the true camera poses.
        map_axes: axes of the ground truth's map frame ('flu' or 'optical'), as the node's
            ``replay run --map-axes``.
        seq: ``render_sequence(scene)`` when the caller already rendered it (the demo).
        imu: also write the route's IMU (``tools/synthetic_imu.py``) and its truth file.

    Returns:
        Number of frames written.
    """
    seq = render_sequence(scene) if seq is None else seq
    readings, extra = imu_messages(scene, imu)
    count = write_frames(spec, seq.images, seq.intrinsics, scene.fps, int(seq.stamps_ns[0]),
                         total=len(seq.images),
                         depths=seq.depth if spec.depth_topic else None, extra=extra)
    c2w = map_axes_transform(map_axes) @ seq.c2w
    write_imu_truth(imu, readings, map_axes, len(extra))
    write_tum(gt_path, Trajectory(seq.stamps_ns, c2w), comments=[
        f'ground truth of the synthetic scene (seed {scene.seed}, {scene.num_frames} frames '
        f'x {scene.laps} laps, '
        f'{scene.width}x{scene.height}, hfov {scene.hfov_deg} deg)',
        f'camera optical frame in the map frame (first camera, map axes {map_axes}), metres'])
    _LOG.info('wrote ground truth %s', gt_path)
    return count


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``make-bag`` subcommand to the replay CLI."""
    p = subparsers.add_parser(
        'make-bag', help='write a rosbag2 bag from images, a video or the synthetic scene',
        description=plain(__doc__.split('\n\n', 1)[1]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument('--images', metavar='DIR', help='folder of images, sorted by name')
    source.add_argument('--video', metavar='FILE', help='video file readable by OpenCV')
    source.add_argument('--synthetic', action='store_true',
                        help='the procedural textured room with a known camera loop')
    p.add_argument('--out', required=True, metavar='BAG', help='output bag folder (new)')
    p.add_argument('--storage', choices=('sqlite3', 'mcap'), default='sqlite3',
                   help='rosbag2 storage plugin (default: %(default)s)')
    p.add_argument('--topic', default=DEFAULT_TOPIC, help='image topic (default: %(default)s)')
    p.add_argument('--info-topic', default='',
                   help='CameraInfo topic (default: camera_info beside --topic)')
    p.add_argument('--frame-id', default='camera_optical_frame',
                   help='header.frame_id of the messages (default: %(default)s)')
    p.add_argument('--compressed', action='store_true',
                   help='write JPEG CompressedImage on <topic>/compressed instead of Image')
    p.add_argument('--encoding', choices=('rgb8', 'bgr8'), default='rgb8',
                   help='raw image encoding (default: %(default)s)')
    p.add_argument('--fps', type=float, default=None,
                   help="frame rate of the stamps (default: 10, or the video's own rate)")
    p.add_argument('--start-sec', type=float, default=DEFAULT_START_NS / 1e9,
                   help='stamp of the first frame in seconds (default: %(default)s)')
    p.add_argument('--max-frames', type=int, default=None, help='stop after this many frames')
    p.add_argument('--stride', type=int, default=1, help='keep every n-th image or video frame')
    p.add_argument('--width', type=int, default=None,
                   help='resize images to this width, keeping the aspect (images, video)')
    p.add_argument('--hfov-deg', type=float, default=70.0,
                   help='horizontal field of view of the pinhole guess (default: %(default)s)')
    for name in ('fx', 'fy', 'cx', 'cy'):
        p.add_argument(f'--{name}', type=float, default=None,
                       help=f'intrinsic {name} in pixels of the written images (all four '
                            'together; default: the pinhole guess)')
    p.add_argument('--frames', type=int, default=SceneConfig.num_frames,
                   help='synthetic: frames in the loop (default: %(default)s)')
    p.add_argument('--size', default=f'{SceneConfig.width}x{SceneConfig.height}',
                   help='synthetic: image size WxH (default: %(default)s)')
    p.add_argument('--seed', type=int, default=0, help='synthetic: texture seed')
    p.add_argument('--loop', action='store_true',
                   help='synthetic: drive the loop twice (--frames each), the second lap '
                        '0.1 m higher: a route that revisits its start (loop closure)')
    p.add_argument('--gt', default=None,
                   help='synthetic: ground-truth TUM output (default: <out>_gt.tum)')
    p.add_argument('--depth', action='store_true',
                   help='synthetic: also write the exact depth as 16UC1 millimetres (a depth '
                        'camera aligned to the colour image) on --depth-topic')
    p.add_argument('--depth-topic', default='',
                   help='synthetic: topic of the depth images (default: depth/image_raw '
                        'beside --topic)')
    p.add_argument('--imu', action='store_true',
                   help='synthetic: also write the IMU of the route (sensor_msgs/Imu from the '
                        'exact trajectory, noise and bias; docs/imu.md) on --imu-topic, and its '
                        'truth '
                        '(mounting, gravity) as <out>_imu.json')
    p.add_argument('--imu-topic', default='',
                   help='synthetic: IMU topic (default: imu beside --topic; with --cameras, '
                        'beside camera 0, the primary: /cam_0/imu)')
    p.add_argument('--imu-rate', type=float, default=200.0,
                   help='synthetic: IMU rate in Hz, a multiple of the frame rate '
                        '(default: %(default)s)')
    p.add_argument('--imu-time-offset', type=float, default=0.0,
                   help='synthetic: IMU clock minus camera clock, seconds (default: '
                        '%(default)s)')
    p.add_argument('--imu-exact', action='store_true',
                   help='synthetic: IMU readings without noise or bias')
    p.add_argument('--cameras', type=int, default=1,
                   help='synthetic: a rig of N cameras with fixed offsets, on /cam_<i>/image_raw '
                        '(tools/synthetic_rig.py; default: one camera on --topic)')
    p.add_argument('--map-axes', choices=('flu', 'optical'), default='flu',
                   help='synthetic: map axes of the ground truth, as replay run --map-axes '
                        '(default: %(default)s)')
    p.set_defaults(handler=run)
    return p


def _explicit_k(args: argparse.Namespace) -> np.ndarray | None:
    given = [getattr(args, n) for n in ('fx', 'fy', 'cx', 'cy')]
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        raise ValueError('--fx, --fy, --cx and --cy go together')
    fx, fy, cx, cy = given
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def run(args: argparse.Namespace) -> int:
    """Run ``make-bag``; returns the exit code (errors raise ``ValueError`` / ``BagError``)."""
    if args.stride < 1:
        raise ValueError(f'--stride must be >= 1, got {args.stride}')
    if args.depth and not args.synthetic:
        raise ValueError('--depth needs --synthetic (the only source with a known depth)')
    if args.imu and not args.synthetic:
        raise ValueError('--imu needs --synthetic (the only source with a known trajectory)')
    depth_topic = (args.depth_topic or f'{args.topic.rsplit("/", 1)[0]}/depth/image_raw') \
        if args.depth else ''
    spec = BagSpec(out=Path(args.out), storage=args.storage, topic=args.topic,
                   info_topic=args.info_topic, frame_id=args.frame_id,
                   compressed=args.compressed, encoding=args.encoding, depth_topic=depth_topic)
    start_ns = int(round(args.start_sec * 1e9))
    if args.synthetic:
        width, _, height = args.size.partition('x')
        scene = SceneConfig(width=int(width), height=int(height), num_frames=args.frames,
                            fps=args.fps or 10.0, seed=args.seed, start_ns=start_ns,
                            laps=2 if args.loop else 1)
        gt = args.gt or spec.out.parent / f'{spec.out.name}_gt.tum'
        imu = None
        if args.imu:
            beside = '/cam_0/image_raw' if args.cameras > 1 else args.topic  # the primary's
            imu = ImuSpec(topic=args.imu_topic or f'{beside.rsplit("/", 1)[0]}/imu',
                          truth=spec.out.parent / f'{spec.out.name}_imu.json',
                          rate_hz=args.imu_rate, time_offset_s=args.imu_time_offset,
                          noise=NOISELESS if args.imu_exact else ImuNoise())
        if args.cameras > 1:  # a rig of cameras
            from lingbot_map_ros.tools.synthetic_rig import gt_path, write_rig
            readings, extra = imu_messages(scene, imu)  # the primary's: camera 0's route
            write_rig(spec, scene, args.cameras, gt, args.map_axes, extra=extra)
            write_imu_truth(imu, readings, args.map_axes, len(extra))
            for i in range(args.cameras):
                _LOG.info('wrote ground truth of camera %d: %s', i, gt_path(gt, i))
        else:
            write_synthetic(spec, scene, gt, args.map_axes, imu=imu)
        log_written(spec.out)
        return 0
    k = _explicit_k(args)
    if args.images:
        files = image_files(args.images)[::args.stride][:args.max_frames]
        write_frames(spec, folder_frames(files, args.width), k, args.fps or 10.0, start_ns,
                     args.hfov_deg, total=len(files))
    else:
        fps = args.fps or (video_fps(args.video) / args.stride) or 10.0
        write_frames(spec, video_frames(args.video, args.stride, args.max_frames, args.width),
                     k, fps, start_ns, args.hfov_deg)
    log_written(spec.out)
    return 0


def log_written(bag: Path) -> None:
    """Log the bag's topics as written (the names to give ``--topic``, ``--cameras``)."""
    with bag_io.open_bag(bag) as reader:
        topics = bag_io.list_topics(reader)
    _LOG.info('wrote %s:\n%s', bag, bag_io.describe_topics(topics))
