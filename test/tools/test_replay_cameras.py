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
"""``lingbot_map_replay run BAG --cameras ...``: several cameras offline, one engine, fused.

One camera takes the same path, as a list of one (``test_one_camera_is_a_list_of_one``).

Run: ``pytest test/tools/test_replay_cameras.py`` (about 20 s on 2 cores; the tiny random-weight
model on CPU). The alignment and failover themselves are checked with an oracle model in
test/engine/test_camera_rig.py.
"""

import json

from lingbot_map_ros.tools import bag_io, trajectory
from lingbot_map_ros.tools.replay import find_config, main
from lingbot_map_ros.tools.replay_cameras import make_sessions, parse_cameras
import numpy as np
import pytest
import torch

FAST = {'stream.image_width': 112, 'cache.scale_frames': 2, 'cache.sliding_window': 4}
SET_FLAGS = [a for k, v in FAST.items() for a in ('--set', f'{k}={v}')]
SEC = 1_000_000_000
TOPICS = {'front': '/cam_front/image_raw', 'left': '/cam_left/image_raw'}

torch.set_num_threads(1)


def _bag(path, num, skip=()):
    """Two cameras at 10 Hz with equal stamps; ``skip``: (camera, index) pairs left out."""
    rng = np.random.default_rng(3)
    scene = rng.integers(0, 255, (48, 200, 3), dtype=np.uint8)
    with bag_io.BagWriter(path) as writer:
        for i in range(num):
            stamp = 100 * SEC + i * SEC // 10
            for k, (name, topic) in enumerate(TOPICS.items()):
                if (name, i) in skip:
                    continue
                rgb = np.ascontiguousarray(scene[:, 40 * k + i:40 * k + i + 64])
                writer.write(topic, stamp + k, bag_io.image_message(rgb, stamp, f'{name}_opt'))
    return path


def _run(bag, out, *extra):
    cameras = ','.join(f'{n}={t}' for n, t in TOPICS.items())
    return main(['run', str(bag), '--out', str(out), '--params-file',
                 str(find_config('demo_tiny_cpu.yaml')), '--torch-threads', '1', *SET_FLAGS,
                 '--cameras', cameras, *extra])


def test_every_camera_gets_a_tum_and_the_primary_drives_the_fused_one(tmp_path):
    num = 6
    bag = _bag(tmp_path / 'bag', num)
    assert _run(bag, tmp_path / 'out') == 0
    stamps = [100 * SEC + i * SEC // 10 for i in range(num)]
    for name in TOPICS:
        own = trajectory.read_tum(tmp_path / 'out' / name / 'trajectory.tum')
        assert own.stamps_ns.tolist() == stamps
        aligned = trajectory.read_tum(tmp_path / 'out' / name / 'aligned.tum')
        assert aligned.stamps_ns.tolist() == stamps
    fused = trajectory.read_tum(tmp_path / 'out' / 'trajectory.tum')
    assert fused.stamps_ns.tolist() == stamps
    front = trajectory.read_tum(tmp_path / 'out' / 'front' / 'aligned.tum')
    np.testing.assert_allclose(fused.c2w, front.c2w, atol=1e-6)  # the primary is the odom
    summary = json.loads((tmp_path / 'out' / 'summary.json').read_text())
    assert summary['primary'] == 'front' and summary['switches'] == 0
    assert summary['fused_poses'] == num
    assert {n: c['poses'] for n, c in summary['cameras'].items()} == {'front': num, 'left': num}
    left = summary['alignment']['left']
    assert left['matched'] == num and left['scale'] > 0 and np.isfinite(left['residual'])


def test_the_second_camera_continues_the_fused_odometry_when_the_first_stops(tmp_path):
    num, stop = 12, 6
    bag = _bag(tmp_path / 'bag', num, skip={('front', i) for i in range(stop, num)})
    assert _run(bag, tmp_path / 'out', '--set', 'diagnostics.stale_after_s=0.25') == 0
    fused = trajectory.read_tum(tmp_path / 'out' / 'trajectory.tum')
    stamps = [100 * SEC + i * SEC // 10 for i in range(num)]
    # front's last pose at 0.5 s; left takes over once front is 0.3 s old (frame 8).
    assert fused.stamps_ns.tolist() == stamps[:stop] + stamps[8:]
    summary = json.loads((tmp_path / 'out' / 'summary.json').read_text())
    assert summary['switches'] == 1


def test_one_engine_serves_every_camera():
    values = {'model.preset': 'tiny', 'stream.device': 'cpu', 'cache.backend': 'sdpa',
              'allow_random_weights': True, **FAST}
    sessions = make_sessions(values, ['a', 'b', 'c'])
    assert len({id(s.engine) for s in sessions.values()}) == 1
    assert sessions['a'].config.cache.streams == 3


@pytest.mark.parametrize('text', ['front', 'front=', '=/x', 'a=/x,a=/y', 'a=/x,b=/x', ''])
def test_bad_camera_lists_are_refused(text):
    with pytest.raises(ValueError, match='--cameras'):
        parse_cameras(text)


def test_camera_list_topics_are_made_absolute():
    cameras = parse_cameras('front=cam/image, left=/l/image')
    assert cameras == {'front': '/cam/image', 'left': '/l/image'}


def test_one_camera_is_a_list_of_one(tmp_path):
    # The same topic run alone (--topic) and as the one camera of --cameras: one path, the same
    # camera poses and per-camera summary; the named run adds the fusion (identity for one).
    num = 6
    bag = _bag(tmp_path / 'bag', num)
    common = ['--params-file', str(find_config('demo_tiny_cpu.yaml')), '--torch-threads', '1',
              *SET_FLAGS]
    assert main(['run', str(bag), '--out', str(tmp_path / 'one'), '--topic', TOPICS['front'],
                 *common]) == 0
    assert main(['run', str(bag), '--out', str(tmp_path / 'rig'), '--cameras',
                 f"front={TOPICS['front']}", *common]) == 0
    alone = trajectory.read_tum(tmp_path / 'one' / 'trajectory.tum')
    named = trajectory.read_tum(tmp_path / 'rig' / 'front' / 'trajectory.tum')
    stamps = [100 * SEC + i * SEC // 10 for i in range(num)]
    assert alone.stamps_ns.tolist() == named.stamps_ns.tolist() == stamps
    assert np.ptp(alone.c2w[:, :3, 3], axis=0).max() > 1e-6  # the poses move
    np.testing.assert_allclose(named.c2w, alone.c2w, rtol=0, atol=1e-6)
    one = json.loads((tmp_path / 'one' / 'summary.json').read_text())
    front = json.loads((tmp_path / 'rig' / 'front' / 'summary.json').read_text())
    assert one['poses'] == front['poses'] == num and front['camera'] == 'front'
    assert (tmp_path / 'rig' / 'front' / 'trajectory.png').exists()
    rig = json.loads((tmp_path / 'rig' / 'summary.json').read_text())
    assert rig['fused_poses'] == num and rig['cameras']['front']['poses'] == num
