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
"""engine/cameras/camera_rig.py: a second camera's alignment, fused odometry, failover.

Two oracle sessions (``oracle_model.py``: ground-truth poses seen through a random Sim(3) per
session, plus noise) watch one base through two mountings 90 degrees and 0.1 m apart, as
two cameras of a rig do; the rig must map the second camera's base trajectory into the
first's odom.
"""

from __future__ import annotations

from lingbot_map_ros.engine.cameras.camera_rig import CameraRig, match_stamps
from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.engine.session.stream_feeder import StreamFeeder
import numpy as np
from oracle_model import frame_image, ground_truth, oracle_session
import pytest

SEC = 1_000_000_000
STAMP0 = 100 * SEC
PERIOD_NS = SEC // 10


def _mount(yaw_deg: float, offset: tuple[float, float, float]) -> np.ndarray:
    """Camera-in-base transform: a yaw and a translation."""
    out = np.eye(4)
    half = np.radians(yaw_deg) / 2
    out[:3, :3] = np.asarray(geometry.quaternion_to_rotation(
        np.array([0.0, 0.0, np.sin(half), np.cos(half)])))
    out[:3, 3] = offset
    return out


MOUNTS = {'front': _mount(0.0, (0.0, 0.0, 0.0)), 'left': _mount(90.0, (0.0, 0.1, 0.0))}


def _base_poses(num: int, seeds: dict[str, int], noise: float = 0.002
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Return each camera's base trajectory in its own odom, and its session's scale.

    The odom is anchored at the camera's first pose; every frame has the same stamp in both.
    """
    gt_base = ground_truth(num + 10)
    out, scales = {}, {}
    for name, seed in seeds.items():
        mount = MOUNTS[name]
        session, oracle = oracle_session(gt_base @ mount, noise=noise, seed=seed)
        feeder = StreamFeeder(session)
        preds = []
        for i in range(num):
            preds += feeder.feed(frame_image(i), STAMP0 + i * PERIOD_NS).predictions
        preds += session.flush()
        assert [p.stamp_ns for p in preds] == [STAMP0 + i * PERIOD_NS for i in range(num)]
        base = np.stack([p.c2w for p in preds]) @ np.linalg.inv(mount)
        out[name] = np.linalg.inv(base[0]) @ base
        scales[name] = oracle.sessions[-1][0]
    return out, scales


def test_second_camera_is_aligned_to_the_primary_within_two_percent():
    num = 80
    poses, scales = _base_poses(num, {'front': 1, 'left': 2})
    rig = CameraRig(['front', 'left'], 'front', sync_tolerance_ns=5_000_000,
                    stale_after_s=1.0)
    aligned = []
    for i in range(num):
        rig.add('front', STAMP0 + i * PERIOD_NS, poses['front'][i], i * 0.1)
        aligned.append(rig.add('left', STAMP0 + i * PERIOD_NS + 1_000_000, poses['left'][i],
                               i * 0.1).aligned)
    front = {s.name: s for s in rig.states(num * 0.1)}
    left = front['left']
    # The relative scale of the two sessions is what the fit recovers.
    assert left.scale == pytest.approx(scales['front'] / scales['left'], rel=0.02)
    assert left.matched == num and not left.degenerate and left.live
    # The mounting's 0.1 m is not scaled with the session (model units), so the bound is the
    # noise plus that offset: 2 % of the trajectory's extent.
    extent = float(np.ptp(poses['front'][:, :3, 3], axis=0).max())
    late = np.stack(aligned[20:])
    errors = np.linalg.norm(late[:, :3, 3] - poses['front'][20:, :3, 3], axis=1)
    assert errors.max() < 0.02 * extent
    assert left.residual < 0.02 * extent
    rotation_error = [np.degrees(np.arccos(np.clip((np.trace(a[:3, :3].T @ b[:3, :3]) - 1) / 2,
                                                   -1, 1)))
                      for a, b in zip(late, poses['front'][20:])]
    assert max(rotation_error) < 1.0
    assert front['front'].scale == 1.0 and front['front'].residual == 0.0


def _fused(rig: CameraRig, poses: dict, num: int, stop_primary: int) -> tuple[list, list]:
    fused, switches = [], []
    for i in range(num):
        for name in ('front', 'left'):
            if name == 'front' and i >= stop_primary:
                continue
            update = rig.add(name, STAMP0 + i * PERIOD_NS, poses[name][i], i * 0.1)
            if update.fused is not None:
                fused.append((i, update.fused))
            if update.switched_from is not None:
                switches.append((i, update.switched_from, name))
    return fused, switches


def test_failover_continues_the_odometry_without_a_jump():
    num, stop = 80, 50
    poses, _ = _base_poses(num, {'front': 3, 'left': 4})
    rig = CameraRig(['front', 'left'], 'front', sync_tolerance_ns=0, stale_after_s=0.25)
    fused, switches = _fused(rig, poses, num, stop)
    # front's last pose at 4.9 s; at 5.2 s it is 0.3 s old: left takes over then.
    assert switches == [(52, 'front', 'left')]
    assert rig.source == 'left' and rig.switches == 1
    indices = [i for i, _ in fused]
    assert indices == list(range(stop)) + list(range(52, num))
    centres = np.stack([p[:3, 3] for _, p in fused])
    steps = np.linalg.norm(np.diff(centres, axis=0), axis=1)
    median = float(np.median(steps))
    # Across the switch the odometry moves by the three frames it skipped, no more.
    assert steps[stop - 1] < 3 * 1.5 * median
    assert steps.max() < 3 * 1.5 * median
    # After the switch it still follows the primary's odom (as if the primary had run on).
    after = np.stack([p for i, p in fused if i >= 52])
    errors = np.linalg.norm(after[:, :3, 3] - poses['front'][52:, :3, 3], axis=1)
    extent = float(np.ptp(poses['front'][:, :3, 3], axis=0).max())
    assert errors.max() < 0.03 * extent


def test_the_primary_takes_over_again_when_it_comes_back():
    num = 40
    poses, _ = _base_poses(num, {'front': 5, 'left': 6})
    rig = CameraRig(['front', 'left'], 'front', sync_tolerance_ns=0, stale_after_s=0.25)
    switches = []
    for i in range(num):
        for name in ('front', 'left'):
            if name == 'front' and 10 <= i < 20:
                continue
            update = rig.add(name, STAMP0 + i * PERIOD_NS, poses[name][i], i * 0.1)
            if update.switched_from is not None:
                switches.append((i, update.switched_from, name))
    assert switches == [(12, 'front', 'left'), (20, 'left', 'front')]
    assert rig.source == 'front' and rig.switches == 2


def test_a_primary_reset_starts_every_alignment_again():
    rig = CameraRig(['a', 'b'], 'a', sync_tolerance_ns=0, stale_after_s=1.0)
    pose = np.eye(4)
    for i in range(3):
        pose[0, 3] = i
        rig.add('a', i, pose, 0.0)
        rig.add('b', i, pose * np.array([[1, 1, 1, 2]] * 3 + [[1, 1, 1, 1]]), 0.0)
    assert {s.name: s.matched for s in rig.states(0.0)} == {'a': 0, 'b': 3}
    assert rig.states(0.0)[1].scale == pytest.approx(0.5)
    rig.clear('a')
    state = rig.states(0.0)[1]
    assert state.matched == 0 and state.scale == 1.0


def test_the_fit_follows_the_history_once_it_is_full():
    rig = CameraRig(['a', 'b'], 'a', sync_tolerance_ns=0, stale_after_s=1.0, history=4)
    pose = np.eye(4)
    for i in range(12):
        pose[0, 3], pose[1, 3] = i, i * i * 0.1
        scale = 2.0 if i < 6 else 4.0  # b's scale changes: the last 4 common stamps decide
        b = pose.copy()
        b[:3, 3] *= scale
        rig.add('a', i, pose, 0.0)
        rig.add('b', i, b, 0.0)
    state = rig.states(0.0)[1]
    assert state.matched == 4
    assert state.scale == pytest.approx(0.25)


def test_match_stamps_pairs_each_stamp_once_within_the_tolerance():
    a = np.array([0, 10, 20, 30])
    b = np.array([1, 2, 19, 45])
    ia, ib = match_stamps(a, b, 2)
    assert ia.tolist() == [0, 2] and ib.tolist() == [0, 2]
    assert [x.tolist() for x in match_stamps(a, np.zeros(0, np.int64), 5)] == [[], []]


@pytest.mark.parametrize('names,primary', [([], 'a'), (['a', 'a'], 'a'), (['a'], 'b')])
def test_bad_rigs_are_refused(names, primary):
    with pytest.raises(ValueError, match='unique names'):
        CameraRig(names, primary, 0, 1.0)


def test_a_non_finite_pose_is_refused():
    rig = CameraRig(['a'], 'a', 0, 1.0)
    bad = np.eye(4)
    bad[0, 3] = np.nan
    with pytest.raises(ValueError, match='finite'):
        rig.add('a', 1, bad, 0.0)
