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
"""ImuSession: the IMU tracker at the rollover's hooks, its locked scale as the session mapping.

The keyframes are the synthetic route's exact poses, each session in its own world and its own
units with small pose noise (as ``test_imu_scale_tracker.py``), handed over as predictions.
Run: ``python -m pytest test/engine/imu/test_imu_session.py`` (seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

from lingbot_map_ros.config import ImuConfig
from lingbot_map_ros.engine.imu import ImuBuffer, ImuScaleTracker, so3
from lingbot_map_ros.engine.session.imu_session import ImuSession
from lingbot_map_ros.engine.session.stitching import Sim3Alignment
from lingbot_map_ros.tools.synthetic_imu import frame_poses, ImuNoise, synthetic_imu
from lingbot_map_ros.tools.synthetic_scene import SceneConfig
import numpy as np
import pytest

SCENE = SceneConfig(laps=2)
OVERLAP = 8


@dataclass
class _Pred:
    """The three fields of a FramePrediction that ImuSession reads."""

    stamp_ns: int
    c2w: np.ndarray
    is_keyframe: bool = True


@pytest.fixture(scope='module')
def route():
    """Return a session fed by the route's IMU, the route's poses (metres) and frame stamps."""
    imu = synthetic_imu(SCENE, noise=ImuNoise(), seed=7)
    buf = ImuBuffer(ImuConfig(topic='imu', buffer_s=60.0))
    for t, g, a in zip((imu.stamps_ns - SCENE.start_ns) * 1e-9, imu.gyro, imu.accel):
        assert buf.add(t, g, a) is None
    stamps = np.arange(SCENE.total_frames) * (1_000_000_000 // int(SCENE.fps))
    return buf, imu, frame_poses(SCENE), stamps


def _session(poses_m: np.ndarray, units: float, seed: int) -> np.ndarray:
    """Return keyframes as a session gives them: own world, ``units`` metres each, noise."""
    rng = np.random.default_rng(seed)
    out = np.linalg.inv(poses_m[0]) @ poses_m
    for p in out[1:]:
        p[:3, :3] = p[:3, :3] @ so3.exp(rng.normal(0.0, np.radians(0.05), 3))
        p[:3, 3] += rng.normal(0.0, 0.001, 3)
    out[:, :3, 3] /= units
    return out


def test_without_a_tracker_every_hook_is_a_no_op():
    session = ImuSession()
    fit = Sim3Alignment(2.0, np.eye(3), np.zeros(3), 0.0, False)
    session.observe([_Pred(1, np.eye(4))])
    session.start_session([_Pred(1, np.eye(4))], np.eye(4)[None], np.eye(4)[None], fit)
    session.reset()
    assert not session.enabled and session.stats().state == 'off'
    assert session.scale() is None and session.alignment(fit) is fit
    assert session.alignment(None) is None and session.gravity_continuous(fit) is None


def test_locked_scale_maps_each_session_and_a_depth_scale_comes_first(route):
    buf, imu, poses, stamps = route
    session = ImuSession(ImuScaleTracker(buf.window, imu_from_camera=imu.imu_from_camera))
    assert session.enabled and session.stats().state == 'waiting'
    first = _session(poses[:60], 0.37, seed=1)
    fallback = Sim3Alignment(1.0, np.eye(3), np.zeros(3), 0.0, True)
    session.observe([_Pred(int(t), c) for t, c in zip(stamps[:60], first)])
    assert session.stats().state == 'locked'
    assert session.scale() == pytest.approx(0.37, rel=0.02)
    mapping = session.alignment(fallback)
    assert mapping.scale == pytest.approx(session.scale(), rel=1e-12)
    np.testing.assert_allclose(mapping.rotation, np.eye(3), atol=1e-12)
    assert session.alignment(fallback, depth_scale=0.4) is fallback  # depth first
    gravity = session.gravity_continuous(mapping)
    assert np.linalg.norm(gravity) == pytest.approx(1.0, abs=1e-12)
    # A rollover: the next session (other units) starts on the overlap keyframes; until its own
    # scale locks the rollover's fit is kept.
    lo = 60 - OVERLAP
    second = _session(poses[lo:120], 0.55, seed=2)
    reference = mapping.apply(first[-OVERLAP:])
    turn = so3.exp(np.array([0.0, 0.0, 0.3]))
    fit = Sim3Alignment(0.5, turn, np.array([0.1, 0.2, 0.3]), 0.0, False)
    session.start_session([_Pred(int(t), c) for t, c in zip(stamps[lo:60], second[:OVERLAP])],
                          reference, second[:OVERLAP], fit)
    assert session.stats().state == 'waiting' and session.scale() is None
    assert session.alignment(fit) is fit
    session.observe([_Pred(int(t), c) for t, c in zip(stamps[60:120], second[OVERLAP:])])
    assert session.stats().state == 'locked'
    assert session.scale() == pytest.approx(0.55, rel=0.02)
    mapping = session.alignment(fit)
    assert mapping.scale == pytest.approx(session.scale(), rel=1e-12)
    np.testing.assert_allclose(mapping.rotation, turn, atol=1e-12)  # the fit's rotation
    np.testing.assert_allclose(mapping.apply(second[:OVERLAP])[:, :3, 3].mean(axis=0),
                               reference[:, :3, 3].mean(axis=0), atol=1e-9)
    # A reset forgets the scale and gravity.
    session.reset()
    assert session.scale() is None and session.stats().gravity is None
    assert session.alignment(fit) is fit
