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
"""Pacing a loop check beside the live frames: ``loop.verify_unit_interval`` (``FramePace``).

A verification unit runs beside at most one frame in N. Checked without clocks: the pace's
decisions counted in frames (``take``, and the frame count ``FramePace()`` returns), a check of
the tiny random-weight model run in a frame's overlap hook and on a worker thread (its units
N frames apart, every unit run, the pass's outputs bitwise those of N = 1, the live frames
bitwise those without a check). The parameter and the node's feed wiring:
``test/ros/test_loop_pacing_params.py``.

Run: ``python -m pytest test/engine/loop/test_verify_pacing.py`` (about 30 s on 2 busy cores).
"""

from __future__ import annotations

import io
import threading

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.mapping.verify.model_verifier import FramePace, ModelVerifier
from lingbot_map_ros.engine.mapping.verify.verification import KeyframeRecord
from lingbot_map_ros.engine.scale_pass import scale_units
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig
import numpy as np
from PIL import Image
import pytest
import torch

SIZE_HW = (84, 112)
SAFETY_TIMEOUT_S = 60.0
"""Only ends a wait whose frames stopped: never reached while the test streams frames."""


def _units_let_go(pace: FramePace, num_frames: int) -> list[int]:
    """Tick ``num_frames`` frames; the frames (1, 2, ...) whose ``take`` let a unit go."""
    ran = []
    for _ in range(num_frames):
        pace.tick()
        if pace.take():
            ran.append(pace.frames)
    return ran


@pytest.mark.parametrize('every', [1, 2, 3, 5])
def test_units_run_beside_one_frame_in_n(every):
    ran = _units_let_go(FramePace(every_n_frames=every), 30)
    # Frame 1 carries the first unit, then every N-th frame: 1, 1 + N, 1 + 2N, ...
    assert ran == list(range(1, 31, every))
    assert len(ran) == -(-30 // every)


def test_frames_without_a_check_buy_no_burst_of_units():
    pace = FramePace(every_n_frames=3)
    for _ in range(50):  # frames served while no check ran
        pace.tick()
    assert pace.pending and pace.take()  # the first unit of a check runs at once
    assert not pace.pending
    assert _units_let_go(pace, 7) == [53, 56]


def test_the_waiting_pace_lets_units_go_n_frames_apart():
    pace = FramePace(timeout_s=SAFETY_TIMEOUT_S, every_n_frames=3)
    let_go = []
    worker = threading.Thread(target=lambda: let_go.extend(pace() for _ in range(6)))
    worker.start()
    frames = 0
    while worker.is_alive() and frames < 100_000:
        pace.tick()
        frames += 1
        worker.join(0.001)
    assert not worker.is_alive()
    assert len(let_go) == 6 and let_go[0] >= 1
    assert all(b - a >= 3 for a, b in zip(let_go, let_go[1:])), let_go


def test_a_stopped_camera_still_lets_the_unit_go():
    pace = FramePace(timeout_s=0.01, every_n_frames=4)
    pace.tick()
    assert pace() == 1
    assert pace() == 1  # no frame came: let go after the timeout, not stuck
    assert not pace.pending


@pytest.mark.parametrize('bad', [0, -1, 1.5, True])
def test_frame_pace_refuses_a_bad_interval(bad):
    with pytest.raises(ValueError, match='every_n_frames'):
        FramePace(every_n_frames=bad)


# ---- a check of the tiny model beside a live stream -----------------------------------------

def _config(device: str = 'cpu') -> EngineConfig:
    return EngineConfig.from_flat({
        'model.preset': 'tiny', 'stream.device': device, 'stream.image_width': SIZE_HW[1],
        'cache.backend': 'sdpa', 'cache.scale_frames': 4, 'cache.sliding_window': 4,
        'stream.enable_depth': True, 'cache.streams': 2})


def _jpeg(rgb: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format='JPEG', quality=95)
    return out.getvalue()


def _live(device: str):
    """Return the room's frames, an engine and 8 keyframes stored as the closer keeps them."""
    room = render_sequence(SceneConfig(width=SIZE_HW[1], height=SIZE_HW[0], num_frames=36))
    engine = Engine.load(_config(device), allow_random_weights=True)
    session = StreamingSession(_config(device), engine=engine, place_descriptors=True)
    preds = [p for i, image in enumerate(room.images[:8]) for p in session.step(image, tag=i)]
    session.close()
    records = {p.frame_index: KeyframeRecord(p.frame_index, p.stamp_ns, p.c2w, p.descriptor,
                                             _jpeg(p.image.cpu().numpy())) for p in preds}
    verifier = ModelVerifier(engine, lookup=records.get)
    verifier.warm_up(SIZE_HW)  # what a pass captures on CUDA, not beside a live frame
    verifier.close()
    return room.images, engine, records


@pytest.fixture(scope='module')
def live():
    """Return the room's frames, a CPU engine and its keyframes (:func:`_live`)."""
    return _live('cpu')


def _stream(engine: Engine, images: list, num_frames: int, overlap=None) -> list:
    """Stream ``num_frames`` frames (the room's, in a loop); every prediction's pose and depth."""
    session = StreamingSession(engine.config, engine=engine)
    out = []
    for i in range(num_frames):
        for pred in session.step(images[10 + i % 24], tag=100 + i):
            out.append((pred.frame_index, pred.pose_enc, pred.depth.cpu().numpy().copy()))
        if overlap is not None and i >= 4:  # streaming frames only, as the overlap hook
            overlap()
    session.close()
    return out


def _checked_in_the_overlap_hook(live, every: int, num_frames: int):
    """Run a check paced at ``every`` in the overlap hook; (pass, answer, unit frames, frames)."""
    images, engine, records = live
    verifier = ModelVerifier(engine, lookup=records.get)
    verification = verifier.start(records[7], records[1])
    pace = FramePace(every_n_frames=every)
    unit_frames = []

    def unit() -> None:
        pace.tick()
        if not verification.done and pace.take():
            verification.step()
            unit_frames.append(pace.frames)

    frames = _stream(engine, images, num_frames, unit)
    answer = verification.result() if verification.done else None
    verifier.close()
    return verification, answer, unit_frames, frames


def _assert_same_frames(got: list, expected: list) -> None:
    assert [f[0] for f in got] == [f[0] for f in expected] == list(range(len(expected)))
    for (_, pose_a, depth_a), (_, pose_b, depth_b) in zip(got, expected):
        np.testing.assert_array_equal(pose_a, pose_b)
        np.testing.assert_array_equal(depth_a, depth_b)


def _assert_same_outputs(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and {'pose_enc', 'depth', 'depth_conf'} <= a.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_paced_check_runs_every_unit_n_frames_apart_with_the_same_result(live):
    images, engine, _ = live
    every = 3
    paced, paced_answer, unit_frames, frames = _checked_in_the_overlap_hook(live, every, 50)
    units = paced.units
    assert paced.done and len(unit_frames) == units  # the whole check ran
    assert all(b - a == every for a, b in zip(unit_frames, unit_frames[1:])), unit_frames
    assert unit_frames[-1] - unit_frames[0] + 1 == (units - 1) * every + 1  # latency in frames
    # The same check back to back (N = 1): every unit beside its own frame, the same pass.
    reference, reference_answer, unit_frames_1, _ = _checked_in_the_overlap_hook(live, 1, 50)
    assert len(unit_frames_1) == units and unit_frames_1[-1] - unit_frames_1[0] + 1 == units
    _assert_same_outputs(paced.outputs, reference.outputs)
    assert paced_answer.reason == reference_answer.reason
    assert paced_answer.accepted == reference_answer.accepted
    # No live frame delayed or dropped: one prediction per frame, bitwise those without a check.
    _assert_same_frames(frames, _stream(engine, images, 50))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_a_paced_check_on_cuda_gives_the_pass_of_n_1():
    """On CUDA (whole-frame graphs): N = 3 and N = 1 give the same pass and the same frames.

    Both runs hold the check's pages before the live stream leases its own, so the live pages
    lie at the same place in the pool (on CUDA a run's place can change the last bits).
    """
    live_cuda = _live('cuda')
    paced, _, unit_frames, frames = _checked_in_the_overlap_hook(live_cuda, 3, 50)
    reference, _, _, frames_1 = _checked_in_the_overlap_hook(live_cuda, 1, 50)
    assert paced.done and len(unit_frames) == paced.units
    assert all(b - a == 3 for a, b in zip(unit_frames, unit_frames[1:]))
    _assert_same_outputs(paced.outputs, reference.outputs)
    _assert_same_frames(frames, frames_1)


def test_a_check_on_the_worker_thread_is_paced_by_the_frames(live):
    images, engine, records = live
    every = 3
    pace = FramePace(timeout_s=SAFETY_TIMEOUT_S, every_n_frames=every)
    let_go = []
    verifier = ModelVerifier(engine, lookup=records.get, pace=lambda: let_go.append(pace()))
    answers = []
    worker = threading.Thread(target=lambda: answers.append(
        verifier.verify(records[7], records[1])))
    worker.start()
    session = StreamingSession(engine.config, engine=engine)
    served = []
    i = 0
    # The frames go on until the check ends; the cap is only a safety net.
    while worker.is_alive() and i < 2000:
        served.extend(p.frame_index for p in session.step(images[10 + i % 24], tag=100 + i))
        pace.tick()  # as LoopFeed.feed after each frame
        i += 1
    worker.join(SAFETY_TIMEOUT_S)
    session.close()
    verifier.close()
    assert not worker.is_alive() and len(answers) == 1
    # Every unit ran, each let go by the pace, N frames or more after the one before.
    assert len(let_go) == scale_units(4, engine.config.model.depth, True)
    assert all(b - a >= every for a, b in zip(let_go, let_go[1:])), let_go
    assert served == list(range(i))  # every frame served, none waited for or dropped
    alone = ModelVerifier(engine, lookup=records.get)
    answer = alone.verify(records[7], records[1])
    alone.close()
    assert (answers[0].reason, answers[0].accepted) == (answer.reason, answer.accepted)
