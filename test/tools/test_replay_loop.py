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
"""Replay with loop closure: ``make-bag --synthetic --loop`` and ``run --loop-closure``.

Run: ``pytest test/tools/test_replay_loop.py`` (needs gtsam; 10-30 s on 2 cores). The map
accuracy is checked with the place oracle (test/engine/loop/place_oracle.py: a drifting
odometry of a route driven twice, descriptors that encode the place) and a verifier from the
ground truth; the command line end to end with the tiny random-weight model. The ``--ply`` map
is checked with the room oracle (test/engine/loop/room_oracle.py: depth of a box's walls seen
from the true poses, an odometry whose heading drifts).
"""

import json
from pathlib import Path
import sys

from lingbot_map_ros.config import LoopConfig, MapConfig
from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.map.ply import read_ply
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.offline import OfflineRunner, RunOptions
from lingbot_map_ros.tools.replay import find_config, main
from lingbot_map_ros.tools.synthetic_scene import LAP_RISE, render_sequence, SceneConfig
from lingbot_map_ros.tools.trajectory import read_tum
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine' / 'loop'))
from loop_scenes import ate, LandmarkVerifier, Places, route  # noqa: E402,I100,I202
from oracle_model import frame_image, oracle_session  # noqa: E402,I100,I202
from place_oracle import drifting, PlaceOracle  # noqa: E402,I100,I202
from room_oracle import wall_distance, WallOracle  # noqa: E402,I100,I202

pytest.importorskip('gtsam')

SEC = 1_000_000_000
LAP = 30
LOOP = LoopConfig(exclude_recent=10, min_score=0.9, image_store_mb=0.0)


def test_synthetic_loop_revisits_its_start():
    one = render_sequence(SceneConfig(width=32, height=24, num_frames=8))
    two = render_sequence(SceneConfig(width=32, height=24, num_frames=8, laps=2))
    assert len(two.images) == len(two.c2w) == len(two.stamps_ns) == 16
    np.testing.assert_array_equal(two.images[0], one.images[0])
    # The second lap passes the first lap's places, a little higher: same heading.
    for k in range(8):
        np.testing.assert_allclose(two.c2w[k + 8, :3, :3], two.c2w[k, :3, :3], atol=1e-9)
        gap = np.linalg.norm(two.c2w[k + 8, :3, 3] - two.c2w[k, :3, 3])
        assert gap == pytest.approx(LAP_RISE, rel=1e-6)
    assert np.all(np.diff(two.stamps_ns) > 0)


def test_make_bag_synthetic_loop_writes_two_laps_and_their_truth(tmp_path):
    bag, gt = tmp_path / 'loop_bag', tmp_path / 'gt.tum'
    assert main(['make-bag', '--synthetic', '--loop', '--frames', '6', '--size', '32x24',
                 '--out', str(bag), '--gt', str(gt)]) == 0
    with bag_io.open_bag(bag) as reader:
        topics = bag_io.list_topics(reader)
    assert sum(t.num_messages for t in topics.values() if t.msgtype in
               bag_io.IMAGE_TYPES) == 12
    truth = read_tum(gt)
    assert len(truth.stamps_ns) == 12
    assert np.linalg.norm(truth.positions[6] - truth.positions[0]) == \
        pytest.approx(LAP_RISE, rel=1e-5)


def _oracle_bag(path: Path, num: int) -> None:
    with bag_io.BagWriter(path) as bag:
        for i in range(num):
            stamp = 50 * SEC + i * SEC // 10
            bag.write('/cam/image', stamp,
                      bag_io.image_message(frame_image(i, (48, 64)), stamp, 'cam'))


def test_offline_loop_closure_corrects_the_map_trajectory(tmp_path):
    truth = route(LAP, lap_offset=0.1)
    odometry = drifting(truth)
    places = Places(truth, LAP)
    _oracle_bag(tmp_path / 'bag', 2 * LAP)
    session, _ = oracle_session(odometry, **{'cache.scale_frames': 2})
    oracle = PlaceOracle(odometry, session.config, places)
    session.replace_stream(oracle)
    verifier = LandmarkVerifier(lambda k: truth[k], places,
                                units=lambda: oracle.sessions[0][0])
    runner = OfflineRunner(RolloverSession(session), RunOptions(map_axes='optical', loop=LOOP),
                           tmp_path / 'out', verifier=verifier)
    with bag_io.open_bag(tmp_path / 'bag') as reader:
        summary = runner.run(bag_io.read_raw(reader, ['/cam/image']))
    assert summary['poses'] == 2 * LAP
    loop = summary['loop']['segments'][0]
    assert loop['keyframes'] == 2 * LAP and loop['accepted'] >= 5, loop
    odom, in_map = runner.trajectory.c2w, runner.map_trajectory.c2w
    np.testing.assert_array_equal(runner.map_trajectory.stamps_ns, runner.trajectory.stamps_ns)
    before, after = ate(odom, truth), ate(in_map, truth)
    assert after <= 0.3 * before, (before, after)
    json.dumps(summary)  # the summary is written as JSON


def _not_json(constant):
    raise ValueError(f'{constant} is not JSON')


def test_run_loop_closure_on_the_command_line(tmp_path):
    bag, gt, out = tmp_path / 'bag', tmp_path / 'gt.tum', tmp_path / 'out'
    assert main(['make-bag', '--synthetic', '--loop', '--frames', '12', '--size', '64x48',
                 '--out', str(bag), '--gt', str(gt)]) == 0
    # The tiny model's random descriptors all look alike: every keyframe older than 4 is a
    # candidate, so the model's verification pass runs too.
    code = main(['run', str(bag), '--out', str(out), '--params-file',
                 str(find_config('demo_tiny_cpu.yaml')), '--torch-threads', '1',
                 '--loop-closure', '--gt', str(gt), '--set', 'stream.image_width=112',
                 '--set', 'loop.exclude_recent=4', '--set', 'loop.min_score=-1.0'])
    assert code == 0
    # Strict JSON: a figure that does not exist (optimisation_ms without a loop) is null.
    summary = json.loads((out / 'summary.json').read_text(), parse_constant=_not_json)
    odometry, in_map = read_tum(out / 'trajectory.tum'), read_tum(out / 'trajectory_map.tum')
    assert len(odometry.stamps_ns) == len(in_map.stamps_ns) == summary['poses'] == 24
    loop = summary['loop']['segments'][0]
    assert loop['keyframes'] == 24 and loop['candidates'] > 0
    assert loop['verified'] + loop['verification_errors'] > 0, loop
    assert 'evaluation_map' in summary


def _room_run(out: Path, bag: Path, loop: LoopConfig | None) -> tuple[OfflineRunner, np.ndarray]:
    """Replay the room bag with ``--ply``; return the runner and ground truth -> output frame."""
    truth = route(LAP, lap_offset=0.1)
    places = Places(truth, LAP)
    session, _ = oracle_session(truth, **{'cache.scale_frames': 2, 'stream.enable_depth': True})
    oracle = WallOracle(truth, session.config, places)
    session.replace_stream(oracle)
    verifier = LandmarkVerifier(lambda k: truth[k], places,
                                units=lambda: oracle.sessions[0][0])
    options = RunOptions(map_axes='optical', loop=loop, save_ply=True,
                         map=MapConfig(voxel_size=0.02, confidence_percentile=0.0))
    runner = OfflineRunner(RolloverSession(session), options, out, verifier=verifier)
    with bag_io.open_bag(bag) as reader:
        summary = runner.run(bag_io.read_raw(reader, ['/cam/image']))
    assert summary['poses'] == 2 * LAP
    # The engine's world from the oracle's session frame, by the first camera (truth[0] there).
    scale, rot, trans = oracle.sessions[0]
    first = sim3.make(rot @ truth[0, :3, :3], scale * rot @ truth[0, :3, 3] + trans)
    world_from_session = runner.trajectory.c2w[0] @ sim3.inverse(first)
    return runner, world_from_session @ sim3.make(rot, trans, scale)


@pytest.fixture(scope='module')
def room_maps(tmp_path_factory):
    """Replay the room bag with and without loop closure (both with ``--ply``)."""
    tmp = tmp_path_factory.mktemp('room')
    _oracle_bag(tmp / 'bag', 2 * LAP)
    with_loop = _room_run(tmp / 'loop', tmp / 'bag', LOOP)
    without = _room_run(tmp / 'odom', tmp / 'bag', None)
    return tmp, with_loop, without


def test_ply_with_loop_closure_is_in_map_with_one_wall(room_maps):
    tmp, (runner, frame_from_truth), _ = room_maps
    assert sorted(p.name for p in (tmp / 'loop').iterdir()) == ['map.ply', 'map_odom.ply']
    assert runner.map_trajectory is not None
    in_map, _ = read_ply(tmp / 'loop' / 'map.ply')
    in_odom, _ = read_ply(tmp / 'loop' / 'map_odom.ply')
    assert len(in_map) > 1000 and len(in_odom) > 1000
    unit = float(np.cbrt(np.linalg.det(frame_from_truth[:3, :3])))
    # The pieces are placed by the final graph: the revisit's walls lie on the first visit's,
    # so the whole map is one room (every point near a true wall); the odometry's drifted
    # heading puts the same keyframes' walls far off (0.046 and 1.08 measured).
    after = np.percentile(wall_distance(in_map, frame_from_truth), 90) / unit
    before = np.percentile(wall_distance(in_odom, frame_from_truth), 90) / unit
    assert after < 0.25 and before > 0.5, (after, before)
    assert after < 0.2 * before, (after, before)


def test_ply_without_loop_closure_is_the_odom_map_as_before(room_maps):
    tmp, _, (runner, frame_from_truth) = room_maps
    assert runner.map_trajectory is None
    assert sorted(p.name for p in (tmp / 'odom').iterdir()) == ['map.ply']
    xyz, rgb = read_ply(tmp / 'odom' / 'map.ply')
    # The same odom-frame accumulator as the loop run's map_odom.ply, point for point.
    odom_xyz, odom_rgb = read_ply(tmp / 'loop' / 'map_odom.ply')
    np.testing.assert_array_equal(xyz, odom_xyz)
    np.testing.assert_array_equal(rgb, odom_rgb)
    unit = float(np.cbrt(np.linalg.det(frame_from_truth[:3, :3])))
    assert np.percentile(wall_distance(xyz, frame_from_truth), 90) / unit > 0.5


def test_ply_with_loop_closure_writes_one_map_per_segment(tmp_path):
    # The stamps jump back after the first lap: the session resets, and each segment's map
    # is placed by its own graph (no revisit inside a lap: the graph keeps the odometry).
    with bag_io.BagWriter(tmp_path / 'bag') as bag:
        for i in range(2 * LAP):
            stamp = (50 if i < LAP else 40) * SEC + i * SEC // 10  # recorded in order
            bag.write('/cam/image', 50 * SEC + i * SEC // 10,
                      bag_io.image_message(frame_image(i, (48, 64)), stamp, 'cam'))
    runner, _ = _room_run(tmp_path / 'out', tmp_path / 'bag', LOOP)
    assert [s['reason'] for s in runner.segments] == ['start', 'clock_jump']
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == [
        'map.ply', 'map_odom.ply', 'map_odom_seg1.ply', 'map_seg1.ply']
    for suffix in ('', '_seg1'):
        in_map, _ = read_ply(tmp_path / 'out' / f'map{suffix}.ply')
        in_odom, _ = read_ply(tmp_path / 'out' / f'map_odom{suffix}.ply')
        assert len(in_map) > 1000
        # Both maps hold the same keyframes' points, placed alike: each point within half a
        # voxel of the other map's (0 measured).
        assert np.percentile(_nearest(in_map, in_odom), 90) < 0.5 * 0.02
        assert np.percentile(_nearest(in_odom, in_map), 90) < 0.5 * 0.02


def _nearest(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance of each point of ``a`` to the nearest point of ``b``."""
    b = torch.as_tensor(b, dtype=torch.float64)
    return np.concatenate([torch.cdist(torch.as_tensor(part, dtype=torch.float64), b)
                           .min(dim=1).values.numpy()
                           for part in np.array_split(a, max(len(a) // 1024, 1))])
