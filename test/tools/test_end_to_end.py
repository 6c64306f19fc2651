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
"""End to end: a bag played into the running node gives the poses of the offline replay.

Run: ``pytest test/tools/test_end_to_end.py`` (about 10 s on 2 cores; markers ``rostest``,
``slow``). Starts ``python -m lingbot_map_ros.ros.nodes.node`` as a child process on a private DDS
domain.

Path: synthetic scene -> bag (``make_bag``) -> ``BagPlayer`` with /clock and reliable QoS ->
node (``config/demo_tiny_cpu.yaml``, bag mode, ``use_sim_time``) -> ``/lingbot_map/pose`` recorded;
then the same bag through ``OfflineRunner`` with the same YAML and seed. Both run the tiny
random-weight model in float32 on CPU with one torch thread, so the math is the same; the test
asserts the same number of poses, identical stamps (integer nanoseconds), and positions and
quaternions equal within 1e-5 (observed: 0, bit-identical).
"""

import os
import random

from lingbot_map_ros.config import load_yaml
from lingbot_map_ros.ros.messages.conversions import c2w_to_pose
from lingbot_map_ros.ros.publishers.odom_frames import OPTICAL_IN_BODY
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.demo import node_overrides, NodeProcess, play_and_record
from lingbot_map_ros.tools.make_bag import BagSpec, write_synthetic
from lingbot_map_ros.tools.offline import OfflineRunner, RunOptions
from lingbot_map_ros.tools.replay import find_config
from lingbot_map_ros.tools.synthetic_scene import SceneConfig
import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.rostest, pytest.mark.slow]

# A private DDS domain (kept if the test runner chose one) so parallel runs never mix nodes.
os.environ.setdefault('ROS_DOMAIN_ID', str(random.randint(100, 199)))
os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')

NUM_FRAMES = 24
TOLERANCE = 1e-5
"""Largest accepted difference of a position (map units) or quaternion component."""


def _pose_vectors(c2w: np.ndarray) -> np.ndarray:
    """[N, 7] (x, y, z, qx, qy, qz, qw) with the quaternion sign fixed (w >= 0)."""
    rows = []
    for m in c2w:
        position, quat = c2w_to_pose(m)
        rows.append(position + quat)
    return np.array(rows)


def test_played_bag_matches_offline_replay(tmp_path):
    bag = tmp_path / 'bag'
    write_synthetic(BagSpec(out=bag), SceneConfig(width=192, height=108, num_frames=NUM_FRAMES),
                    tmp_path / 'gt.tum')
    params = find_config('demo_tiny_cpu.yaml')
    node = NodeProcess(params, node_overrides(NUM_FRAMES, None),
                       {'image': '/camera/image_raw', 'camera_info': '/camera/camera_info'},
                       tmp_path / 'node.log', torch_threads=1)
    live = play_and_record(bag, node, expected=NUM_FRAMES, rate=1.0, timeout_s=90.0)
    assert node.exit_code() == 0, node.log_tail()

    torch.set_num_threads(1)  # the node's OMP_NUM_THREADS: same reduction order
    values = load_yaml(params)
    runner = OfflineRunner.from_values(values, RunOptions(map_axes='flu'),
                                       tmp_path / 'offline')
    with bag_io.open_bag(bag) as reader:
        summary = runner.run(bag_io.read_raw(reader, ['/camera/image_raw']))
    offline = runner.trajectory

    assert summary['frames_read'] == NUM_FRAMES and summary['drops'] == {}
    assert len(summary['segments']) == 1
    assert live.stamps_ns.size == offline.stamps_ns.size == NUM_FRAMES, node.log_tail()
    np.testing.assert_array_equal(live.stamps_ns, offline.stamps_ns)
    # The node publishes base_link in odom (REP 105, default mounting: base_link = camera
    # body); the replay writes the optical frame in the first camera's flu world. Same poses:
    # odom -> optical = B @ inv(offline[0]) @ offline, with B the optical-in-body rotation.
    live_optical = live.c2w @ OPTICAL_IN_BODY
    expected = OPTICAL_IN_BODY @ np.linalg.inv(offline.c2w[0]) @ offline.c2w
    np.testing.assert_allclose(_pose_vectors(live_optical), _pose_vectors(expected),
                               rtol=0, atol=TOLERANCE)
    # The poses are not trivially equal: a random-weight model still moves the camera.
    assert np.ptp(offline.positions, axis=0).max() > 1e-3
