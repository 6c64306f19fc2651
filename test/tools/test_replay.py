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
"""``lingbot_map_replay run`` / ``make-bag``, the offline runner, and the trajectory helpers.

Run: ``pytest test/tools/test_replay.py`` (about 30 s on 2 cores); the tests that run the
engine are marked ``slow``, so ``-m 'not slow'`` keeps only the trajectory helpers' checks.
Every bag is generated here: the synthetic scene, hand-made messages, or 5 frames of
``../shared/data/loop`` (skipped when that folder is absent). The engine is the tiny
random-weight model on CPU (``config/demo_tiny_cpu.yaml`` with smaller images and scale phase).
"""

import json
import logging

from lingbot_map_ros.config import load_yaml
from lingbot_map_ros.engine.image.geometry import quaternion_to_rotation
from lingbot_map_ros.engine.map.ply import read_ply
from lingbot_map_ros.tools import bag_io, trajectory
from lingbot_map_ros.tools.offline import OfflineRunner, RunOptions
from lingbot_map_ros.tools.replay import find_config, main
import numpy as np
import pytest
import torch

FAST = {'stream.image_width': 112, 'cache.scale_frames': 2, 'cache.sliding_window': 4}
SET_FLAGS = [a for k, v in FAST.items() for a in ('--set', f'{k}={v}')]
SEC = 1_000_000_000

# One torch thread: several threads on 2 busy cores are ~10x slower for the tiny model.
torch.set_num_threads(1)


@pytest.fixture(scope='module')
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp('replay')
    code = main(['make-bag', '--synthetic', '--frames', '10', '--size', '128x72',
                 '--out', str(root / 'bag'), '--storage', 'mcap'])
    assert code == 0
    return root / 'bag', root / 'bag_gt.tum'


def _run(bag, out, *extra):
    return main(['run', str(bag), '--out', str(out), '--params-file',
                 str(find_config('demo_tiny_cpu.yaml')), '--torch-threads', '1', *SET_FLAGS,
                 *extra])


@pytest.mark.slow
def test_run_writes_trajectory_plot_depth_cloud_and_summary(synthetic, tmp_path):
    bag, gt = synthetic
    assert _run(bag, tmp_path, '--gt', str(gt), '--depth', '--ply', '--set', 'map.pixel_stride=1',
                '--set', 'map.voxel_size=0.001') == 0
    est, truth = trajectory.read_tum(tmp_path / 'trajectory.tum'), trajectory.read_tum(gt)
    np.testing.assert_array_equal(est.stamps_ns, truth.stamps_ns)
    assert np.all(np.isfinite(est.c2w))
    summary = json.loads((tmp_path / 'summary.json').read_text())
    assert (summary['frames_read'], summary['poses'], summary['drops']) == (10, 10, {})
    assert summary['topic'] == '/camera/image_raw' and len(summary['segments']) == 1
    assert summary['frames_per_s'] > 0 and summary['map_axes'] == 'flu'
    assert summary['config']['cache.scale_frames'] == 2
    png = (tmp_path / 'trajectory.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10_000
    depth_files = sorted((tmp_path / 'depth').glob('*.npz'))
    assert [int(p.stem) for p in depth_files] == truth.stamps_ns.tolist()
    with np.load(depth_files[3]) as frame:
        # 128x72 -> width 112, height round(72 * 112 / 128 / 14) * 14 = 56.
        assert frame['depth'].shape == frame['depth_conf'].shape == (56, 112)
        np.testing.assert_allclose(frame['c2w'], est.c2w[3], atol=1e-6)
    # The node's map, from the same accumulator and the YAML's map.* settings: 10 keyframes
    # of 112x56 pixels, half of each kept by the confidence filter, merged into voxels.
    xyz, rgb = read_ply(tmp_path / 'map.ply')
    assert 1000 < len(xyz) < 0.6 * 10 * 112 * 56 and np.isfinite(xyz).all()
    assert rgb.dtype == np.uint8 and rgb.std() > 0
    if summary['evaluation'] is not None:  # evo installed
        assert summary['evaluation']['num_pairs'] == 10
        assert np.isfinite(summary['evaluation']['ape_m']['rmse'])


@pytest.mark.slow
def test_run_compressed_real_frames_from_an_image_folder(tmp_path, shared_file):
    loop = shared_file('data', 'loop')
    bag = tmp_path / 'loop'
    assert main(['make-bag', '--images', str(loop), '--stride', '20', '--max-frames', '5',
                 '--width', '259', '--compressed', '--out', str(bag)]) == 0
    assert _run(bag, tmp_path / 'out') == 0
    summary = json.loads((tmp_path / 'out' / 'summary.json').read_text())
    assert summary['topic'] == '/camera/image_raw/compressed'
    assert summary['msgtype'] == bag_io.COMPRESSED_TYPE
    assert (summary['frames_read'], summary['poses']) == (5, 5)


@pytest.mark.slow
def test_run_errors_exit_1_with_a_clear_message(synthetic, tmp_path, caplog):
    bag, _ = synthetic
    caplog.set_level(logging.ERROR)
    assert _run(tmp_path / 'missing', tmp_path / 'a') == 1
    assert 'does not exist' in caplog.text
    caplog.clear()
    assert _run(bag, tmp_path / 'b', '--topic', '/front/image') == 1
    assert "'/front/image' is not in the bag" in caplog.text
    assert '/camera/image_raw [sensor_msgs/msg/Image] 10 msgs' in caplog.text
    caplog.clear()
    assert _run(bag, tmp_path / 'c', '--topic', '/camera/camera_info') == 1
    assert 'has type sensor_msgs/msg/CameraInfo' in caplog.text
    caplog.clear()
    assert _run(bag, tmp_path / 'd', '--set', 'allow_random_weights=false') == 1
    assert '--allow-random-weights' in caplog.text
    caplog.clear()
    assert _run(bag, tmp_path / 'e', '--set', 'cache.no_such_key=1') == 1
    assert 'cache.no_such_key' in caplog.text


def test_run_checks_the_topics_before_it_builds_the_model(synthetic, tmp_path, caplog):
    # Weights that cannot load: building the model first would report them, not the typo.
    bag, _ = synthetic
    caplog.set_level(logging.ERROR)
    bad_weights = ('--set', f'weights={tmp_path / "missing.pt"}', '--set',
                   'allow_random_weights=false')
    assert _run(bag, tmp_path / 'a', '--topic', '/camera/imag_raw', *bad_weights) == 1
    assert "'/camera/imag_raw' is not in the bag" in caplog.text
    assert 'missing.pt' not in caplog.text
    caplog.clear()
    assert _run(bag, tmp_path / 'b', '--depth-topic', '/camera/depth', *bad_weights) == 1
    assert "--depth-topic: topic '/camera/depth' is not in the bag" in caplog.text
    assert 'missing.pt' not in caplog.text
    caplog.clear()
    assert _run(bag, tmp_path / 'c', *bad_weights) == 1  # right topics: now the weights
    assert 'missing.pt' in caplog.text


def _image(value: int, stamp_ns: int, size=(48, 64), encoding='rgb8'):
    rng = np.random.default_rng(value)
    rgb = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
    msg = bag_io.image_message(rgb, stamp_ns, 'cam')
    if encoding != 'rgb8':
        msg = type(msg)(header=msg.header, height=msg.height, width=msg.width,
                        encoding=encoding, is_bigendian=0, step=msg.step, data=msg.data)
    return msg


@pytest.mark.slow
def test_runner_counts_drops_and_starts_a_segment_per_reset(tmp_path):
    t0 = 100 * SEC
    messages = [  # (stamp, size, encoding); scale phase of 2 frames
        (t0, (48, 64), 'rgb8'), (t0 + SEC // 10, (48, 64), 'rgb8'),
        (t0 + 2 * SEC // 10, (48, 64), 'rgb8'), (t0 + 3 * SEC // 10, (48, 64), 'rgb8'),
        (t0 + 4 * SEC // 10, (48, 64), 'weird8'),        # dropped: encoding
        (t0 + 25 * SEC // 100, (48, 64), 'rgb8'),        # dropped: 50 ms back
        (t0 - 5 * SEC, (48, 64), 'rgb8'),                # 5 s back: reset, segment 1
        (t0 - 49 * SEC // 10, (48, 64), 'rgb8'),
        (t0 - 48 * SEC // 10, (96, 64), 'rgb8'),         # new size: reset, segment 2, fed again
        (t0 - 47 * SEC // 10, (96, 64), 'rgb8')]
    bag = tmp_path / 'bag'
    with bag_io.BagWriter(bag) as writer:
        for i, (stamp, size, encoding) in enumerate(messages):
            # Recorded in this order; the header stamps are what goes back.
            writer.write('/img', 1000 * SEC + i, _image(i, stamp, size, encoding))
    values = {**load_yaml(find_config('demo_tiny_cpu.yaml')), **FAST}
    options = RunOptions(map_axes='optical', resolution_change_frames=1)
    runner = OfflineRunner.from_values(values, options, tmp_path)
    with bag_io.open_bag(bag) as reader:
        summary = runner.run(bag_io.read_raw(reader, ['/img']))
    assert summary['drops'] == {'encoding': 1, 'stamp_out_of_order': 1}
    assert [(s['reason'], s['start_stamp_ns'], s['poses']) for s in summary['segments']] == [
        ('start', t0, 4), ('clock_jump', t0 - 5 * SEC, 2),
        ('resolution_changed', t0 - 48 * SEC // 10, 2)]
    kept = [m[0] for i, m in enumerate(messages) if i not in (4, 5)]
    np.testing.assert_array_equal(runner.trajectory.stamps_ns, kept)
    comments = '\n'.join(runner.tum_comments(summary))
    assert f'segment 2 (resolution_changed) starts at stamp {t0 - 48 * SEC // 10}' in comments


@pytest.mark.slow
def test_runner_flushes_a_stream_shorter_than_the_scale_phase(tmp_path):
    bag = tmp_path / 'bag'
    with bag_io.BagWriter(bag) as writer:
        for i in range(3):
            writer.write('/img', (i + 1) * SEC, _image(i, (i + 1) * SEC))
    values = {**load_yaml(find_config('demo_tiny_cpu.yaml')), **FAST,
              'cache.scale_frames': 8}
    runner = OfflineRunner.from_values(values, RunOptions(max_frames=2), tmp_path)
    with bag_io.open_bag(bag) as reader:
        summary = runner.run(bag_io.read_raw(reader, ['/img']), total=3)
    assert (summary['frames_read'], summary['poses']) == (2, 2)
    np.testing.assert_array_equal(runner.trajectory.stamps_ns, [SEC, 2 * SEC])


def _random_trajectory(num: int, seed: int) -> trajectory.Trajectory:
    rng = np.random.default_rng(seed)
    c2w = np.tile(np.eye(4), (num, 1, 1))
    c2w[:, :3, :3] = quaternion_to_rotation(rng.normal(size=(num, 4)))
    c2w[:, :3, 3] = np.cumsum(rng.normal(size=(num, 3)), axis=0)
    stamps = 1_700_000_000 * SEC + np.arange(num) * 33_333_333
    return trajectory.Trajectory(stamps.astype(np.int64), c2w)


def test_tum_round_trip_keeps_exact_stamps(tmp_path):
    traj = _random_trajectory(20, 0)
    trajectory.write_tum(tmp_path / 't.tum', traj, ['made by a test'])
    text = (tmp_path / 't.tum').read_text()
    assert text.startswith('# made by a test\n# timestamp tx ty tz qx qy qz qw\n')
    assert '\n1700000000.033333333 ' in text
    back = trajectory.read_tum(tmp_path / 't.tum')
    np.testing.assert_array_equal(back.stamps_ns, traj.stamps_ns)
    np.testing.assert_allclose(back.c2w, traj.c2w, atol=1e-7)
    (tmp_path / 'bad.tum').write_text('1.0 2.0 3.0\n')
    with pytest.raises(ValueError, match='bad.tum:1: expected 8 values'):
        trajectory.read_tum(tmp_path / 'bad.tum')


def test_sim3_alignment_and_evaluation_recover_a_similarity(tmp_path):
    ref = _random_trajectory(30, 1)
    moved = np.eye(4)
    moved[:3, :3] = quaternion_to_rotation(np.array([0.2, -0.1, 0.4, 0.9]))
    moved[:3, 3] = (3.0, -2.0, 0.5)
    est_c2w = moved @ ref.c2w
    est_c2w[:, :3, 3] = 0.25 * est_c2w[:, :3, 3]
    est = trajectory.Trajectory(ref.stamps_ns + 1_000_000, est_c2w)  # 1 ms stamp offset
    i_est, i_ref = trajectory.associate(est, ref)
    np.testing.assert_array_equal(i_est, i_ref)
    scale, rot, shift = trajectory.align_sim3(est.positions, ref.positions)
    np.testing.assert_allclose(scale * est.positions @ rot.T + shift, ref.positions, atol=1e-9)
    assert scale == pytest.approx(4.0)
    pytest.importorskip('evo')
    trajectory.write_tum(tmp_path / 'ref.tum', ref)
    trajectory.write_tum(tmp_path / 'est.tum', est)
    result = trajectory.evaluate(tmp_path / 'est.tum', tmp_path / 'ref.tum')
    assert result['num_pairs'] == 30 and result['scale'] == pytest.approx(4.0, rel=1e-6)
    assert result['ape_m']['rmse'] < 1e-5 and result['rpe_m']['max'] < 1e-5


@pytest.mark.slow
def test_run_rolls_over_into_one_continuous_trajectory(tmp_path):
    bag_dir = tmp_path / 'long'
    assert main(['make-bag', '--synthetic', '--frames', '60', '--size', '128x72',
                 '--out', str(bag_dir / 'bag'), '--storage', 'mcap']) == 0
    # The command: sessions of 24 keyframes, 4 run again: rollovers at frames 24, 44.
    assert _run(bag_dir / 'bag', tmp_path / 'out', '--set', 'stream.session_keyframes=24',
                '--set', 'stream.overlap_keyframes=4') == 0
    summary = json.loads((tmp_path / 'out' / 'summary.json').read_text())
    assert (summary['frames_read'], summary['poses'], summary['drops']) == (60, 60, {})
    assert (summary['sessions'], summary['rollovers'], len(summary['segments'])) == (3, 2, 1)
    est = trajectory.read_tum(tmp_path / 'out' / 'trajectory.tum')
    truth = trajectory.read_tum(bag_dir / 'bag_gt.tum')
    np.testing.assert_array_equal(est.stamps_ns, truth.stamps_ns)  # each frame once, in order
    assert np.all(np.isfinite(est.c2w))
