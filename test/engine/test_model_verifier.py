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
"""The model's loop check (``engine/mapping/verify/``: model, verdict, view agreement).

Two halves. The geometry and the answer are judged on the synthetic room's exact depth and
cameras, handed to the check as a pass would (random weights say nothing about accuracy):
the same view, neighbouring views, a drifted odometry with a different scale per side, a
wrong place. The pass itself runs the tiny random-weight model on the CPU beside a live
stream: its shapes and units, the live frames bitwise unchanged, the pool as before.

Run: ``python -m pytest test/engine/test_model_verifier.py`` (about 20 s on 2 cores).
"""

from __future__ import annotations

from dataclasses import replace
import io
import threading

from lingbot_map_ros.config import EngineConfig, LoopConfig
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.engine.mapping.verify.model_verifier import (decode_rgb, FramePace,
                                                                  ModelVerifier)
from lingbot_map_ros.engine.mapping.verify.pass_verdict import verdict, VerifierConfig
from lingbot_map_ros.engine.mapping.verify.verification import KeyframeRecord
from lingbot_map_ros.engine.mapping.verify.view_agreement import (agreement, centre_spread_ratio,
                                                                  View)
from lingbot_map_ros.engine.scale_pass import scale_units
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig
import numpy as np
from PIL import Image
import pytest
from tiny_engine import tiny_config
import torch

NUM_FRAMES = 36
SIZE_HW = (84, 112)
REASONS = {'ok', 'few_inliers', 'residual', 'pose_disagrees', 'too_few_points',
           'scale_unobservable', 'non_finite'}


@pytest.fixture(scope='module')
def room():
    """Render 36 frames round the room: 10 degrees of the loop apart."""
    return render_sequence(SceneConfig(width=SIZE_HW[1], height=SIZE_HW[0],
                                       num_frames=NUM_FRAMES))


def _intrinsics(room) -> np.ndarray:
    # The renderer casts rays through pixel centres (u + 0.5); the model's pixel (u, v) is the
    # index itself (spec section 7): the same rays with the principal point half a pixel less.
    k = room.intrinsics.copy()
    k[:2, 2] -= 0.5
    return k


def _sim3(scale: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q *= np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] *= -1
    out = np.eye(4)
    out[:3, :3] = scale * q
    out[:3, 3] = rng.normal(size=3)
    return out


def _seen_by(frame: np.ndarray, poses: np.ndarray) -> np.ndarray:
    """Return ``poses`` in a frame ``x' = s R x + t`` with unit-scale rotation blocks."""
    scale = np.cbrt(np.linalg.det(frame[:3, :3]))
    out = frame @ poses
    out[..., :3, :3] /= scale
    return out


def _view(room, i: int, pass_frame: np.ndarray, depth: np.ndarray | None = None) -> View:
    scale = np.cbrt(np.linalg.det(pass_frame[:3, :3]))
    d = room.depth[i] if depth is None else depth
    return View(_seen_by(pass_frame, room.c2w[i]), _intrinsics(room),
                (scale * d).astype(np.float32), np.ones(SIZE_HW, np.float32))


def _pass_output(views: list[View]) -> dict:
    """Return what a joint pass gives for ``views`` (pose encodings, depth, confidence)."""
    height, width = SIZE_HW
    rows = []
    for view in views:
        quat = np.asarray(geometry.rotation_to_quaternion(view.c2w[:3, :3]))
        k = view.intrinsics
        fov_h = 2 * np.arctan(height / 2 / k[1, 1])
        fov_w = 2 * np.arctan(width / 2 / k[0, 0])
        rows.append(np.concatenate([view.c2w[:3, 3], quat, [fov_h, fov_w]]))
    return {'pose_enc': torch.tensor(np.stack(rows), dtype=torch.float32),
            'depth': torch.tensor(np.stack([v.depth for v in views])),
            'depth_conf': torch.tensor(np.stack([v.confidence for v in views]))}


def _relative_error(found: np.ndarray, truth: np.ndarray) -> tuple[float, float, float]:
    """Return (rotation degrees, translation relative to its length, scale ratio - 1)."""
    s_found, s_truth = (np.cbrt(np.linalg.det(m[:3, :3])) for m in (found, truth))
    rot = (found[:3, :3] / s_found).T @ (truth[:3, :3] / s_truth)
    angle = np.degrees(np.arccos(np.clip((np.trace(rot) - 1) / 2, -1, 1)))
    trans = np.linalg.norm(found[:3, 3] - truth[:3, 3]) / np.linalg.norm(truth[:3, 3])
    return float(angle), float(trans), float(s_found / s_truth - 1)


# ---- the geometry, on exact depth -----------------------------------------------------------

def test_the_same_view_agrees_with_itself_exactly(room):
    view = _view(room, 3, np.eye(4))
    found = agreement(view, view, confidence_quantile=0.0)
    np.testing.assert_allclose(found.fit.matrix, np.eye(4), atol=1e-9)
    assert found.inlier_fraction == pytest.approx(1.0)
    assert found.fit.residual == pytest.approx(0.0, abs=1e-9)
    assert found.rotation_gap_deg == pytest.approx(0.0, abs=1e-6)


def test_neighbouring_views_agree_under_their_relative_pose(room):
    pass_frame = _sim3(0.7, seed=1)
    query, candidate = _view(room, 5, pass_frame), _view(room, 4, pass_frame)
    found = agreement(query, candidate)
    truth = np.linalg.inv(candidate.c2w) @ query.c2w
    angle, trans, scale = _relative_error(found.fit.matrix, truth)
    assert angle < 0.5 and trans < 0.05 and abs(scale) < 0.01
    assert found.inlier_fraction > 0.3
    assert found.fit.residual < 0.02


def test_a_depth_map_of_another_place_does_not_agree(room):
    # The camera head says "frame 4 beside frame 5", the depths come from far away.
    query = _view(room, 5, np.eye(4), depth=room.depth[NUM_FRAMES // 2])
    found = agreement(query, _view(room, 4, np.eye(4)))
    assert found.inlier_fraction < 0.2  # about 0.9 for the right depth (test above)
    assert found.rotation_gap_deg > 3.0  # the fit strays from the camera head's pose


def test_centre_spread_ratio_is_the_scale_between_two_views_of_a_stretch(room):
    frame = _sim3(2.5, seed=3)
    ratio = centre_spread_ratio(_seen_by(frame, room.c2w[:4]), room.c2w[:4])
    assert ratio == pytest.approx(2.5, rel=1e-9)
    assert centre_spread_ratio(room.c2w[:1], room.c2w[:1]) is None
    assert centre_spread_ratio(room.c2w[:2], np.stack([room.c2w[0]] * 2)) is None


# ---- the answer: scales of the odometry's two sides and of the pass --------------------------

def _records(room, odom: dict[int, np.ndarray]) -> dict[int, KeyframeRecord]:
    return {i: KeyframeRecord(i, int(room.stamps_ns[i]), pose, np.ones(4, np.float32) / 2,
                              b'jpeg') for i, pose in odom.items()}


@pytest.mark.parametrize('scale_fixed', [False, True])
def test_a_revisit_gives_the_relative_pose_of_the_drifted_odometry(room, scale_fixed):
    candidate, query = [0, 1], [NUM_FRAMES - 1, NUM_FRAMES - 2]
    # The odometry: exact on the candidate's side; on the query's, drifted by a similarity
    # (with a metric camera the scale stays, only the pose drifts).
    drift = _sim3(1.0 if scale_fixed else 1.6, seed=4)
    odom = {i: room.c2w[i] for i in candidate}
    odom.update({i: _seen_by(drift, room.c2w[i]) for i in query})
    records = _records(room, odom)
    pass_frame = _sim3(0.6, seed=5)
    views = [_view(room, i, pass_frame) for i in candidate + query]
    sides = ([records[i] for i in candidate], [records[i] for i in query])
    answer = verdict(VerifierConfig(scale_fixed=scale_fixed), sides, _pass_output(views))
    assert answer.accepted and answer.reason == 'ok'
    # Without drift the odometry's own relative pose, in the query node's drifted units.
    drift_scale = np.cbrt(np.linalg.det(drift[:3, :3]))
    truth = np.linalg.inv(room.c2w[candidate[0]]) @ room.c2w[query[0]]
    truth[:3, :3] /= drift_scale
    angle, trans, scale = _relative_error(answer.relative, truth)
    assert angle < 0.5 and trans < 0.05 and abs(scale) < 0.02
    if scale_fixed:
        assert np.cbrt(np.linalg.det(answer.relative[:3, :3])) == pytest.approx(1.0, abs=1e-9)
    assert answer.information.shape == (7, 7)
    assert np.all(np.diag(answer.information) > 0)
    assert answer.inlier_fraction > 0.3 and answer.residual < 0.05


def test_a_still_camera_cannot_measure_scale(room):
    records = _records(room, {i: room.c2w[0] for i in (0, 1, 30, 31)})
    views = [_view(room, 0, np.eye(4))] * 2 + [_view(room, NUM_FRAMES - 1, np.eye(4))] * 2
    answer = verdict(VerifierConfig(), ([records[0], records[1]], [records[30], records[31]]),
                     _pass_output(views))
    assert not answer.accepted and answer.reason == 'scale_unobservable'


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match='frames_per_side'):
        VerifierConfig(frames_per_side=0)
    with pytest.raises(ValueError, match='max_residual'):
        VerifierConfig(max_residual=float('nan'))
    with pytest.raises(ValueError, match='min_inlier_fraction'):
        VerifierConfig(min_inlier_fraction=1.5)
    loop = LoopConfig(verify_frames=3, min_inlier_fraction=0.4, inlier_threshold=0.02)
    config = VerifierConfig.from_loop(loop, scale_fixed=True)
    assert (config.frames_per_side, config.min_inlier_fraction, config.inlier_threshold,
            config.scale_fixed) == (3, 0.4, 0.02, True)


# ---- the pass on the tiny model, beside a live stream ----------------------------------------

def _config(device: str = 'cpu') -> EngineConfig:
    return tiny_config({'stream.device': device, 'stream.image_width': SIZE_HW[1],
                        'cache.scale_frames': 4, 'cache.sliding_window': 4,
                        'stream.enable_depth': True, 'cache.streams': 2})


def _jpeg(rgb: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format='JPEG', quality=95)
    return out.getvalue()


def _live(room, device: str = 'cpu'):
    """Run a live stream on an engine; its keyframes as the loop closer would store them."""
    engine = Engine.load(_config(device), allow_random_weights=True)
    session = StreamingSession(_config(device), engine=engine, place_descriptors=True)
    preds = []
    for i, image in enumerate(room.images[:8]):
        preds.extend(session.step(image, tag=i))
    records = {p.frame_index: KeyframeRecord(p.frame_index, p.stamp_ns, p.c2w, p.descriptor,
                                             _jpeg(p.image.cpu().numpy())) for p in preds}
    return engine, session, records


@pytest.fixture(scope='module')
def live(room):
    """Return the CPU engine, its live session and the session's keyframes."""
    return _live(room)


def _stream_outputs(session: StreamingSession, images, between=None) -> list:
    out = []
    for i, image in enumerate(images):
        for pred in session.step(image, tag=100 + i):
            out.append((pred.pose_enc, pred.depth.cpu().numpy().copy()))
        if between is not None:
            between()
    return out


def _own(session: StreamingSession):
    """Return the live stream's own cache counters (the pool's are checked on their own)."""
    return replace(session.stream.cache_stats(), pool_pages_free=0, pool_streams=0)


def test_the_pass_runs_on_scratch_pages_and_gives_them_back(live):
    engine, session, records = live
    before = (engine.pool_stats(), _own(session))
    verifier = ModelVerifier(engine, lookup=records.get)
    verifier.warm_up(SIZE_HW)
    assert (engine.pool_stats(), _own(session)) == before and not verifier.in_flight
    verification = verifier.start(records[7], records[1])
    assert verification.units == scale_units(4, engine.config.model.depth, True)
    assert verifier.in_flight
    assert verifier.start(records[6], records[2]).result().reason == 'busy'
    # While it runs it holds pages of the pool's headroom, never the live stream's.
    verification.step()
    assert engine.pool_stats().pool_pages_free < before[0].pool_pages_free
    assert _own(session) == before[1]
    answer = verification.result()
    assert answer.reason in REASONS and answer.accepted == (answer.reason == 'ok')
    assert 0.0 <= answer.inlier_fraction <= 1.0
    assert not verifier.in_flight
    assert (engine.pool_stats(), _own(session)) == before
    # The sides: the candidate first, then its nearest neighbour; the query, then its own.
    sides = verifier.sides(records[7], records[1])
    assert [[r.index for r in side] for side in sides] == [[1, 0], [7, 6]]
    verifier.close()


def _check_frames_beside_a_check(room, engine: Engine, records: dict) -> None:
    """Frames with one unit of a check after each: bitwise those without; the pool as before."""
    config = engine.config
    images = room.images[10:10 + 18]
    verifier = ModelVerifier(engine, lookup=records.get)
    verifier.warm_up(SIZE_HW)
    # The reference stream leases its pages while a check holds its own, as the checked
    # stream will, so both lie at the same place in the pool: on CUDA the place of a run can
    # change a kernel's summation order (the last bits), which is not what is checked here.
    held = verifier.start(records[7], records[2])
    reference = StreamingSession(config, engine=engine)
    expected = _stream_outputs(reference, images)
    reference.close()
    held.cancel()
    pool_before = engine.pool_stats()
    session = StreamingSession(config, engine=engine)
    verification = verifier.start(records[7], records[2])
    # One unit after each frame, as a frame's overlap hook would run it.
    got = _stream_outputs(session, images, verification.step)
    assert verification.done
    verification.result()
    session.close()
    assert engine.pool_stats() == pool_before
    assert len(got) == len(expected)
    for (pose_a, depth_a), (pose_b, depth_b) in zip(got, expected):
        np.testing.assert_array_equal(pose_a, pose_b)
        np.testing.assert_array_equal(depth_a, depth_b)
    verifier.close()


def test_frames_beside_a_verification_are_bitwise_unchanged(room, live):
    _check_frames_beside_a_check(room, live[0], live[2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_graphed_frames_beside_a_verification_are_bitwise_unchanged(room):
    """The same on CUDA: whole-frame graphs, captured heads, the check's units between."""
    engine, session, records = _live(room, 'cuda')
    assert session.stats().fast_path == 'whole_frame'
    session.close()
    _check_frames_beside_a_check(room, engine, records)


def test_verify_on_another_thread_paced_by_frames(room, live):
    engine, _, records = live
    images = room.images[10:10 + 18]
    reference = StreamingSession(_config(), engine=engine)
    expected = _stream_outputs(reference, images)
    reference.close()
    answers = []
    # The timeout only ends a check whose frames stopped: here it keeps going after the last.
    pace = FramePace(timeout_s=0.01)
    verifier = ModelVerifier(engine, lookup=records.get, pace=pace)
    worker = threading.Thread(target=lambda: answers.append(
        verifier.verify(records[6], records[1])))
    worker.start()
    session = StreamingSession(_config(), engine=engine)
    got = _stream_outputs(session, images, pace.tick)
    worker.join(timeout=120)  # a safety net
    session.close()
    assert len(answers) == 1 and answers[0].reason in REASONS
    for (pose_a, depth_a), (pose_b, depth_b) in zip(got, expected):
        np.testing.assert_array_equal(pose_a, pose_b)
        np.testing.assert_array_equal(depth_a, depth_b)
    verifier.close()


def test_frame_pace_keeps_one_tick_and_times_out():
    pace = FramePace(timeout_s=0.01)
    with pytest.raises(ValueError, match='timeout_s'):
        FramePace(timeout_s=0.0)
    assert not pace.pending
    pace.tick()
    pace.tick()  # a second tick before a unit is not kept
    assert pace.pending
    pace()
    assert not pace.pending  # the one kept tick was used
    pace()  # no frame: returns after the timeout
    assert not pace.pending


def test_a_keyframe_without_a_readable_image_is_refused(live):
    engine, _, records = live
    broken = KeyframeRecord(50, 0, np.eye(4), records[1].descriptor, b'not a jpeg')
    verifier = ModelVerifier(engine)
    pool_before = engine.pool_stats()
    answer = verifier.verify(broken, records[1])
    assert not answer.accepted and answer.reason == 'bad_image' and answer.relative is None
    assert engine.pool_stats() == pool_before and not verifier.in_flight
    assert decode_rgb(None) is None and decode_rgb(b'') is None


def test_a_pass_larger_than_the_scale_phase_is_refused(live):
    engine, _, _ = live
    with pytest.raises(ValueError, match='scale_frames'):
        ModelVerifier(engine, VerifierConfig(frames_per_side=3))
