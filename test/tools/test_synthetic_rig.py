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
"""``make-bag --synthetic --cameras N``: a synchronised rig read back from the bag.

Run: ``python -m pytest test/tools/test_synthetic_rig.py``.
"""

from __future__ import annotations

from lingbot_map_ros.ros.messages.conversions import camera_info_k, image_msg_to_rgb, stamp_to_ns
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.replay import main
from lingbot_map_ros.tools.synthetic_rig import RIG_BASELINE_M, rig_mounts, RIG_YAW_DEG
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig
from lingbot_map_ros.tools.trajectory import read_tum
import numpy as np
import pytest


def test_rig_bag_has_every_camera_synced_with_its_ground_truth(tmp_path):
    frames, cameras = 4, 2
    assert main(['make-bag', '--synthetic', '--cameras', str(cameras), '--frames', str(frames),
                 '--size', '64x36', '--depth', '--out', str(tmp_path / 'rig')]) == 0
    topics = [f'/cam_{i}/{name}' for i in range(cameras)
              for name in ('image_raw', 'camera_info', 'depth/image_raw')]
    with bag_io.open_bag(tmp_path / 'rig') as reader:
        assert set(bag_io.list_topics(reader)) == set(topics)
        raws = list(bag_io.read_raw(reader))
    by_topic: dict[str, list] = {t: [] for t in topics}
    for raw in raws:
        by_topic[raw.topic].append(bag_io.deserialize(raw))
    assert all(len(msgs) == frames for msgs in by_topic.values())
    images = {i: by_topic[f'/cam_{i}/image_raw'] for i in range(cameras)}
    # Synchronised: the same stamps on every camera; each camera in its own optical frame.
    stamps = [[stamp_to_ns(m.header.stamp) for m in images[i]] for i in range(cameras)]
    assert stamps[0] == stamps[1] and len(set(stamps[0])) == frames
    assert {m.header.frame_id for m in images[1]} == {'cam_1_optical_frame'}
    # The images are the scene rendered from each mount, exactly.
    scene = SceneConfig(width=64, height=36, num_frames=frames)
    mounts = rig_mounts(cameras)
    for i in range(cameras):
        want = render_sequence(scene, mounts[i])
        got = np.stack([image_msg_to_rgb(m) for m in images[i]])
        np.testing.assert_array_equal(got, want.images)
        np.testing.assert_allclose(camera_info_k(by_topic[f'/cam_{i}/camera_info'][0]),
                                   want.intrinsics)
    assert not np.array_equal(np.stack([image_msg_to_rgb(m) for m in images[0]]),
                              np.stack([image_msg_to_rgb(m) for m in images[1]]))
    # Ground truth per camera, in one map frame: camera 1 = camera 0 times the fixed mount.
    gt = [read_tum(tmp_path / f'rig_gt_cam{i}.tum') for i in range(cameras)]
    assert [list(g.stamps_ns) for g in gt] == stamps
    for t in range(frames):
        offset = np.linalg.inv(gt[0].c2w[t]) @ gt[1].c2w[t]
        np.testing.assert_allclose(offset[:3, 3], [RIG_BASELINE_M, 0.0, 0.0], atol=1e-6)
        yaw = np.degrees(np.arctan2(offset[0, 2], offset[2, 2]))
        assert yaw == pytest.approx(RIG_YAW_DEG, abs=1e-6)
    np.testing.assert_allclose(np.linalg.norm(gt[0].c2w[0][:3, 3]), 0.0, atol=1e-9)


def test_a_rig_needs_a_camera():
    with pytest.raises(ValueError, match='one camera or more'):
        rig_mounts(0)
