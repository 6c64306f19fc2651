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
"""IMU rotation factors in the live pose graph: the source, the gate, the marginals, a rebuild.

A two-lap synthetic route (the scene's, with its 200 Hz IMU: noise, biases, the mounting) is
driven with an odometry whose rotation drifts 0.3 deg a keyframe. With the gyroscope's rotation
factors beside the odometry edges the graph's rotations follow the IMU, the marginals shrink in
rotation, a true loop after the lap is still accepted by the gate and a wrong one (a look-alike
place 15 keyframes away) refused.

Run: ``python -m pytest test/engine/imu/test_imu_graph.py`` (seconds; needs gtsam).
"""

from __future__ import annotations

from imu_motion import route
from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.imu import ImuBuffer, so3
from lingbot_map_ros.engine.imu.keyframe_rotation import ImuRotations, UNKNOWN_BIAS_SIGMA
from lingbot_map_ros.engine.mapping.backend import MappingBackend
from lingbot_map_ros.engine.mapping.graph.batch_solve import PoseGraphEdge
from lingbot_map_ros.engine.mapping.graph.pose_graph import PoseGraph
from lingbot_map_ros.imu_config import ImuConfig
from lingbot_map_ros.loop_config import LoopConfig
from lingbot_map_ros.tools.synthetic_imu import ImuNoise
from lingbot_map_ros.tools.synthetic_scene import SceneConfig
import numpy as np
import pytest

pytest.importorskip('gtsam')

SCENE = SceneConfig(laps=2)
NOISE = ImuNoise()
LAP = SCENE.num_frames
DRIFT = so3.exp(np.radians([0.05, -0.1, 0.3]))
"""The odometry's rotation error per keyframe (mostly heading, as a monocular odometry's)."""
SCALE_DRIFT = 0.006
"""Log-scale added to every odometry step (the steady scale drift of ``loop_scenes.py``)."""
CONFIG = LoopConfig()


@pytest.fixture(scope='module')
def drive():
    """Return the route's truth (model units), stamps, a filled IMU buffer, drifting odometry."""
    win = route(slice(0, SCENE.total_frames), noise=NOISE, scene=SCENE)
    buffer = ImuBuffer(ImuConfig(buffer_s=3600.0))
    for t, g, a in zip(win.imu_stamps, win.gyro, win.accel):
        assert buffer.add(float(t), g, a) is None
    odometry = [win.poses[0]]
    for k in range(1, len(win.poses)):
        step = sim3.inverse(win.poses[k - 1]) @ win.poses[k]
        step[:3, :3] = step[:3, :3] @ DRIFT
        odometry.append(odometry[-1] @ step @ sim3.make(np.eye(3), np.zeros(3),
                                                        np.exp(SCALE_DRIFT)))
    return win, buffer, np.stack(odometry)


def rotations(win, buffer, healthy=lambda t: True, bias=None) -> ImuRotations:
    """Return the gyroscope's rotations over ``buffer`` (the route's true mean bias)."""
    return ImuRotations(buffer.window, NOISE.gyro_noise_density, win.mount, healthy,
                        lambda: win.gyro_bias if bias is None else bias)


def information(measured: np.ndarray) -> np.ndarray:
    """Return an odometry edge's information: ``loop_steps.py``'s model, the default config."""
    step = float(np.linalg.norm(measured[:3, 3]))
    sigmas = [max(CONFIG.odometry_translation_sigma * step, 1e-3)] * 3 + \
        [CONFIG.odometry_rotation_sigma] * 3 + [CONFIG.odometry_scale_sigma]
    return np.diag(1.0 / np.square(sigmas))


def build(win, buffer, odometry, imu: bool, upto: int | None = None) -> PoseGraph:
    """Return the live graph of the drifting odometry, with the IMU's factors or without."""
    graph = PoseGraph(max_residual=CONFIG.max_residual)
    source = rotations(win, buffer)
    graph.add_node(odometry[0])
    for n in range(1, upto or len(odometry)):
        measured = sim3.inverse(odometry[n - 1]) @ odometry[n]
        rotation = source.keyframe(win.stamps[n - 1], win.stamps[n]) if imu else None
        graph.add_node(odometry[n], PoseGraphEdge(n - 1, n, measured, information(measured),
                                                  'odometry'), rotation)
    return graph


def loop(win, i: int, j: int, claimed: int | None = None) -> PoseGraphEdge:
    """Return a loop i -> j measuring the truth (or, wrong, as if i were ``claimed``)."""
    source = i if claimed is None else claimed
    info = np.diag(1.0 / np.square([0.02] * 3 + [0.01] * 3 + [0.01]))
    return PoseGraphEdge(i, j, sim3.inverse(win.poses[source]) @ win.poses[j], info, 'loop')


def heading_error_deg(graph: PoseGraph, truth: np.ndarray) -> float:
    """Return the worst rotation error of the graph's nodes against the truth, degrees."""
    return max(float(np.degrees(np.linalg.norm(so3.log(
        sim3.rotation_of(p).T @ sim3.rotation_of(t))))) for p, t in zip(graph.poses(), truth))


def test_the_rotation_between_two_stamps_is_the_cameras(drive) -> None:
    win, buffer, _ = drive
    source = rotations(win, buffer)
    for k in (0, 17, 90):
        rotation, cov = source.keyframe(win.stamps[k], win.stamps[k + 1])
        truth = win.poses[k, :3, :3].T @ win.poses[k + 1, :3, :3]
        assert np.degrees(np.linalg.norm(so3.log(rotation.T @ truth))) < 0.05
        assert np.trace(cov) == pytest.approx(3 * NOISE.gyro_noise_density ** 2 / SCENE.fps,
                                              rel=0.05)
    assert source.added == 3 and source.num_skipped == 0
    # An end a rounding error past the last reading (one instant converted twice) is covered.
    end = float(win.imu_stamps[-1])
    assert source.between(end - 0.1, end + 1e-9) is not None
    # Readings that do not cover the interval, a stream not ok, stamps not increasing.
    end = float(win.imu_stamps[-1])
    assert source.keyframe(end - 0.05, end + 0.05) is None
    assert source.last_reason == 'not_covered'
    assert source.keyframe(win.stamps[3], win.stamps[2]) is None
    assert source.last_reason == 'bad_interval'
    paused = rotations(win, buffer, healthy=lambda t: False)
    assert paused.keyframe(win.stamps[0], win.stamps[1]) is None
    assert paused.skipped == {'not_ok': 1, 'not_covered': 0, 'bad_interval': 0, 'no_bias': 0}
    assert source.skipped == {'not_ok': 0, 'not_covered': 1, 'bad_interval': 1, 'no_bias': 0}
    assert source.added == 3
    # No bias yet (or a garbage one): the rotation keeps the bias's drift, so no graph factor,
    # and the covariance carries what an unknown bias could turn.
    unbiased = rotations(win, buffer, bias=np.array([np.nan, 0.0, 0.0]))
    assert unbiased.bias() is None
    rotation, cov = unbiased.between(win.stamps[0], win.stamps[10])
    with_bias, known_cov = source.between(win.stamps[0], win.stamps[10])
    off = np.degrees(np.linalg.norm(so3.log(rotation.T @ with_bias)))
    expected = np.degrees(np.linalg.norm(win.gyro_bias)) * 1.0  # 1 s of the bias
    assert off == pytest.approx(expected, rel=0.2)
    np.testing.assert_allclose(cov - known_cov, np.eye(3) * (UNKNOWN_BIAS_SIGMA * 1.0) ** 2,
                               rtol=1e-6, atol=1e-12)
    assert unbiased.keyframe(win.stamps[0], win.stamps[1]) is None
    assert unbiased.last_reason == 'no_bias' and unbiased.skipped['no_bias'] == 1
    # Once the tracker gives one it is kept, even while a later session has none yet.
    given = [win.gyro_bias]
    late = ImuRotations(buffer.window, NOISE.gyro_noise_density, win.mount,
                        gyro_bias=lambda: given[0])
    assert late.keyframe(win.stamps[0], win.stamps[1]) is not None
    given[0] = None
    np.testing.assert_allclose(late.bias(), win.gyro_bias)
    assert late.keyframe(win.stamps[1], win.stamps[2]) is not None and late.added == 2


def test_imu_factors_hold_the_rotation_and_the_gate_still_judges_right(drive) -> None:
    win, buffer, odometry = drive
    plain = build(win, buffer, odometry, imu=False)
    fused = build(win, buffer, odometry, imu=True)
    assert fused.stats()['imu_factors'] == len(odometry) - 1
    assert plain.stats()['imu_factors'] == 0
    worst_plain, worst_fused = heading_error_deg(plain, win.poses), \
        heading_error_deg(fused, win.poses)
    print(f'worst rotation error: {worst_plain:.2f} deg without the IMU factors, '
          f'{worst_fused:.3f} deg with them')
    assert worst_plain > 5.0  # the test can fail: without the IMU the drift stays
    assert worst_fused < 0.5
    # The marginal (what ~/map_pose carries) shrinks in rotation with the factors.
    last = len(odometry) - 1
    rot_plain = np.trace(plain.covariance(last)[3:6, 3:6])
    rot_fused = np.trace(fused.covariance(last)[3:6, 3:6])
    assert rot_fused < 0.05 * rot_plain, (rot_fused, rot_plain)
    # True loops after the lap pass the gate; a look-alike place 15 keyframes off, which the
    # drifting graph alone lets through, is refused with the IMU's rotations.
    for i, j in ((20, 85), (0, 110)):
        assert fused.judge(loop(win, i, j)).accepted
    wrong = loop(win, 5, 85, claimed=20)
    assert plain.judge(wrong).accepted  # the test can fail: the drift hid it
    verdict = fused.judge(wrong)
    assert not verdict.accepted and verdict.reason == 'inconsistent', verdict
    outcome = fused.add_loop(loop(win, 20, 85))
    assert outcome.accepted, outcome
    assert fused.add_loop(wrong).reason == 'inconsistent'
    assert fused.stats()['imu_factors'] == len(odometry) - 1
    assert heading_error_deg(fused, win.poses) < 0.5


def test_imu_factors_survive_a_rebuild(drive) -> None:
    win, buffer, odometry = drive
    graph = build(win, buffer, odometry, imu=True, upto=40)
    before = graph.poses()
    cov_before = graph.covariance(39)
    # White box: the recovery a refused update runs (rebuild from the kept factors).
    graph._recover(graph._g.NonlinearFactorGraph(), graph._g.Values())
    assert graph.stats()['recoveries'] == 1 and graph.stats()['imu_factors'] == 39
    # The rebuild solves afresh (iSAM2 had relinearised only what moved): nearly the same.
    np.testing.assert_allclose(graph.poses(), before, atol=2e-3)
    np.testing.assert_allclose(np.diag(graph.covariance(39)), np.diag(cov_before), rtol=0.05)
    assert heading_error_deg(graph, win.poses[:40]) < 0.5
    plain = build(win, buffer, odometry, imu=False, upto=40)
    assert np.trace(graph.covariance(39)[3:6, 3:6]) < \
        0.05 * np.trace(plain.covariance(39)[3:6, 3:6])


class _NoLoops:
    """A verifier that refuses every candidate (the back end's IMU counting alone)."""

    def verify(self, query, candidate):  # noqa: D102 - the Verifier protocol
        raise AssertionError('no candidate expected')

    def close(self) -> None:  # noqa: D102 - the Verifier protocol
        pass


def test_the_back_end_adds_one_factor_per_keyframe_and_none_across_a_reset(drive) -> None:
    win, buffer, odometry = drive
    source = rotations(win, buffer)
    backend = MappingBackend(LoopConfig(exclude_recent=1000, image_store_mb=0.0), paced=False)
    backend.use_verifier(_NoLoops())
    backend.use_rotations(source)
    rng = np.random.default_rng(0)
    stamp = (win.stamps * 1e9).round().astype(np.int64)
    try:
        for k in range(10):
            backend.observe(int(stamp[k]), odometry[k], rng.normal(size=8))
        assert backend.closer.wait_idle(30.0)
        assert backend.closer.stats()['graph_imu_factors'] == 9
        backend.reset()  # a new odom: the first keyframe after it has no predecessor
        for k in range(10, 14):
            backend.observe(int(stamp[k]), odometry[k], rng.normal(size=8))
        assert backend.closer.wait_idle(30.0)
        assert backend.closer.stats()['graph_imu_factors'] == 3
        assert source.added == 12 and source.num_skipped == 0
        # A keyframe the IMU does not cover: counted, its node goes in without the factor.
        backend.observe(int(win.imu_stamps[-1] * 1e9) + 10**9, odometry[14],
                        rng.normal(size=8))
        assert backend.closer.wait_idle(30.0)
        assert backend.closer.stats()['keyframes'] == 5
        assert backend.closer.stats()['graph_imu_factors'] == 3
        assert source.skipped['not_covered'] == 1
        # Saved maps keep the odometry and loop edges only (docs/imu.md).
        saved, _ = backend.graph_snapshot(30.0)
        assert saved.num_keyframes == 5 and len(saved.edges_ij) == 4
    finally:
        backend.close()
