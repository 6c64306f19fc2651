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
"""A rig of N cameras in the synthetic scene: ``make-bag --synthetic --cameras N``.

The rig moves along the synthetic loop (``synthetic_scene.camera_path``); camera 0 follows the
path exactly (the primary), camera i is mounted at a fixed offset from it (:func:`rig_mounts`,
in camera 0's optical frame: x right, y down, z forward): ``RIG_BASELINE_M`` metres further
right per camera and turned ``RIG_YAW_DEG`` degrees to the right per camera about camera 0's
y axis, so the cameras see overlapping but different parts of the room.

Written into one bag, every camera with the same stamps (a synchronised rig):

==============================  ===================================================
topic                           what
==============================  ===================================================
``/cam_<i>/image_raw``          ``sensor_msgs/Image`` (or ``.../compressed``), frame
                                ``cam_<i>_optical_frame``
``/cam_<i>/camera_info``        its ``CameraInfo`` (all cameras share the intrinsics)
``/cam_<i>/depth/image_raw``    with ``--depth``: its exact depth (16UC1 mm)
``/cam_0/imu``                  with ``--imu``: the primary's IMU (``make_bag.py``)
==============================  ===================================================

Ground truth per camera: ``<gt>`` with ``_cam<i>`` before the suffix (``bag_gt_cam0.tum``,
``bag_gt_cam1.tum``, ...), every camera's optical frame in one map frame: camera 0's first
pose (map axes as ``--map-axes``), so the rig offset is visible between the files. The mount
of each camera is written in its file's comments.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lingbot_map_ros.ros.messages.conversions import map_axes_transform
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.frame_bag import BagSpec, write_frame
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig
from lingbot_map_ros.tools.trajectory import Trajectory, write_tum
import numpy as np

RIG_BASELINE_M = 0.2
"""Sideways step of each camera from the previous one, metres (camera 0's x axis)."""
RIG_YAW_DEG = 30.0
"""Turn of each camera from the previous one, degrees, to the right (about camera 0's y)."""


def rig_mounts(cameras: int) -> np.ndarray:
    """Return the [N, 4, 4] pose of each camera in camera 0's optical frame (identity first).

    Raises:
        ValueError: fewer than one camera.
    """
    if cameras < 1:
        raise ValueError(f'a rig needs one camera or more, got {cameras}')
    mounts = np.tile(np.eye(4), (cameras, 1, 1))
    for i in range(cameras):
        yaw = np.radians(RIG_YAW_DEG * i)
        # Rotation about y (down): positive turns z (forward) towards x (right).
        mounts[i, :3, :3] = [[np.cos(yaw), 0.0, np.sin(yaw)], [0.0, 1.0, 0.0],
                             [-np.sin(yaw), 0.0, np.cos(yaw)]]
        mounts[i, 0, 3] = RIG_BASELINE_M * i
    return mounts


def camera_topics(index: int) -> tuple[str, str]:
    """Return camera ``index``'s image topic and optical frame id."""
    return f'/cam_{index}/image_raw', f'cam_{index}_optical_frame'


def gt_path(gt: str | Path, index: int) -> Path:
    """Return camera ``index``'s ground truth beside ``gt`` (``x_gt.tum``: ``x_gt_cam1.tum``)."""
    gt = Path(gt)
    return gt.with_name(f'{gt.stem}_cam{index}{gt.suffix or ".tum"}')


def write_rig(spec: BagSpec, scene: SceneConfig, cameras: int, gt: str | Path,
              map_axes: str = 'flu', extra: Iterable[tuple[str, int, Any]] = ()) -> int:
    """Render the loop for every camera of the rig into one bag; write each ground truth.

    Args:
        spec: output bag and format (its topic and frame id are replaced per camera; a depth
            topic, when set, becomes each camera's ``depth/image_raw``).
        scene: size, length, frame rate and seed of the scene.
        cameras: N.
        gt: ground-truth path pattern (:func:`gt_path`).
        map_axes: axes of the ground truth's map frame ('flu' or 'optical').
        extra: ``(topic, stamp_ns, message)`` of other sensors (the primary's synthetic IMU),
            written into the same bag.

    Returns:
        Frames written per camera.
    """
    mounts = rig_mounts(cameras)
    seqs = [render_sequence(scene, mount) for mount in mounts]
    specs = []
    for i in range(cameras):
        topic, frame_id = camera_topics(i)
        depth_topic = f'/cam_{i}/depth/image_raw' if spec.depth_topic else ''
        specs.append(BagSpec(out=spec.out, storage=spec.storage, topic=topic,
                             frame_id=frame_id, compressed=spec.compressed,
                             encoding=spec.encoding, depth_topic=depth_topic))
    with bag_io.BagWriter(spec.out, spec.storage) as bag:
        for t in range(scene.num_frames):
            for cam_spec, seq in zip(specs, seqs):
                write_frame(bag, cam_spec, seq.images[t], seq.intrinsics,
                            int(seq.stamps_ns[t]), seq.depth[t] if cam_spec.depth_topic else None)
        for topic, stamp, msg in extra:
            bag.write(topic, stamp, msg)
    axes = map_axes_transform(map_axes)
    for i, (seq, mount) in enumerate(zip(seqs, mounts)):
        write_tum(gt_path(gt, i), Trajectory(seq.stamps_ns, axes @ seq.c2w), comments=[
            f'ground truth of camera {i} of a {cameras}-camera rig in the synthetic scene '
            f'(seed {scene.seed}, {scene.num_frames} frames, {scene.width}x{scene.height})',
            f'camera optical frame in the map frame (camera 0 first pose, axes {map_axes}), m',
            'mount in camera 0 optical frame (row-major 4x4): '
            + ' '.join(f'{v:.6f}' for v in mount.ravel())])
    return scene.num_frames
