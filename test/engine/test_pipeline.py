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
"""StreamingSession with the tiny random-weight model on CPU: phases, schedule, limits, reset.

Run: ``python -m pytest test/engine/test_pipeline.py`` (about 10 s on 2 cores).
"""

from __future__ import annotations

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.errors import (CachePoolExhaustedError, InvalidFrameError,
                                           ResolutionChangedError, SessionLimitError,
                                           TimeIndexLimitError)
from lingbot_map_ros.engine.session.pipeline import StreamingSession
import numpy as np
import pytest
from tiny_engine import random_frame, random_frames, tiny_config
import torch

N_S = 3
WINDOW = 4


def _config(**overrides) -> EngineConfig:
    return tiny_config({'cache.scale_frames': N_S, 'cache.sliding_window': WINDOW}, overrides)


def _run(session: StreamingSession, frames: list[np.ndarray]) -> list:
    preds = []
    for i, frame in enumerate(frames):
        preds.extend(session.step(frame, tag=1_000 + i))
    return preds


def test_weights_are_required_unless_random_is_asked_for():
    with pytest.raises(ValueError, match='no weights'):
        StreamingSession(_config())


def test_scale_phase_then_streaming_schedule():
    session = StreamingSession(_config(**{'stream.keyframe_interval': 2}),
                               allow_random_weights=True)
    frames = random_frames(N_S + 6)
    outputs = [session.step(f, tag=100 + i) for i, f in enumerate(frames)]
    # The first N_s - 1 calls buffer; the N_s-th returns all scale predictions at once.
    assert [len(o) for o in outputs] == [0] * (N_S - 1) + [N_S] + [1] * 6
    preds = [p for o in outputs for p in o]
    assert [p.stamp_ns for p in preds] == [100 + i for i in range(N_S + 6)]
    assert [p.frame_index for p in preds] == list(range(N_S + 6))
    # K=2: streaming frame i is a keyframe iff (i - N_s) % 2 == 0; the time index counts
    # keyframes cached before the frame, so a non-keyframe shares the next keyframe's index.
    assert [p.role for p in preds] == ['scale'] * N_S + ['keyframe', 'non-keyframe'] * 3
    assert [p.time_index for p in preds] == [0, 1, 2, 3, 4, 4, 5, 5, 6]
    stats = session.stats()
    assert stats.keyframes == N_S + 3 and stats.frames_out == N_S + 6
    assert stats.cache.frame_count == N_S + 3
    assert stats.cache.live_pages == min(3, WINDOW)
    for pred in preds:
        rot = pred.c2w[:3, :3]
        np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-9)
        assert pred.image_size_hw == (56, 112) and pred.original_size_hw == (64, 128)


def test_window_caps_live_pages_and_specials_grow():
    session = StreamingSession(_config(), allow_random_weights=True)
    _run(session, random_frames(N_S + WINDOW + 5))
    cache = session.stats().cache
    assert cache.scale_pages == N_S
    assert cache.live_pages == WINDOW
    assert cache.frame_count == N_S + WINDOW + 5
    assert cache.special_tokens == 6 * (N_S + WINDOW + 5)


def test_same_seed_same_poses_and_reset_restarts_identically():
    frames = random_frames(N_S + 3)
    first = StreamingSession(_config(), allow_random_weights=True, seed=7)
    second = StreamingSession(_config(), allow_random_weights=True, seed=7)
    a, b = _run(first, frames), _run(second, frames)
    # Same weights and inputs; a tolerance because BLAS kernels may pick another path for
    # differently aligned buffers. Different seeds differ by far more (order 1e-2 and up).
    np.testing.assert_allclose(np.stack([p.pose_enc for p in a]),
                               np.stack([p.pose_enc for p in b]), rtol=1e-5, atol=1e-6)
    cleared = first.reset()
    assert cleared == {'frames': N_S + 3, 'keyframes': N_S + 3, 'pending_frames': 0}
    assert first.stats().cache.frame_count == 0
    # The reset returned the stream's pages to the engine's pool.
    assert first.stats().cache.pool_streams == first.engine.pool_stats().pool_streams == 0
    again = _run(first, frames)
    np.testing.assert_allclose(np.stack([p.pose_enc for p in again]),
                               np.stack([p.pose_enc for p in a]), atol=1e-6)
    other_seed = _run(StreamingSession(_config(), allow_random_weights=True, seed=8), frames)
    assert np.abs(other_seed[0].pose_enc - a[0].pose_enc).max() > 1e-3


def test_time_index_limit_raises_before_touching_the_cache():
    session = StreamingSession(_config(**{'model.max_frame_num': N_S + 2,
                                          'stream.session_keyframes': N_S + 2,
                                          'stream.overlap_keyframes': N_S}),
                               allow_random_weights=True)
    preds = _run(session, random_frames(N_S + 2))
    assert preds[-1].time_index == N_S + 1
    before = session.stats()
    with pytest.raises(TimeIndexLimitError, match='max_frame_num'):
        session.step(random_frame(3), tag=99)
    after = session.stats()
    assert after.frames_in == before.frames_in
    assert after.cache.frame_count == before.cache.frame_count
    session.reset()
    assert len(_run(session, random_frames(N_S))) == N_S


def test_pool_exhaustion_is_a_typed_error_naming_the_capacity():
    session = StreamingSession(_config(**{'cache.max_total_frames': N_S + 2,
                                          'stream.session_keyframes': N_S + 2,
                                          'stream.overlap_keyframes': N_S}),
                               allow_random_weights=True)
    _run(session, random_frames(N_S + 2))
    with pytest.raises(CachePoolExhaustedError, match='max_total_frames') as err:
        session.step(random_frame(4), tag=5)
    assert isinstance(err.value, SessionLimitError)


def test_bad_frames_and_resolution_changes_leave_the_session_usable():
    session = StreamingSession(_config(), allow_random_weights=True)
    _run(session, random_frames(N_S))
    for bad in (np.zeros((0, 5, 3), np.uint8), np.zeros((64, 128, 3), np.float32),
                np.zeros((64, 128, 2), np.uint8)):
        with pytest.raises(InvalidFrameError):
            session.step(bad, tag=1)
    with pytest.raises(ResolutionChangedError):
        session.step(random_frame(size=(128, 128)), tag=2)
    assert session.stats().frames_in == N_S
    assert len(session.step(random_frame(), tag=3)) == 1


def test_flush_runs_a_short_scale_phase_and_depth_comes_out():
    session = StreamingSession(_config(**{'stream.enable_depth': True}),
                               allow_random_weights=True)
    assert session.step(random_frame(), tag=10) == []
    preds = session.flush()
    assert len(preds) == 1 and preds[0].role == 'scale'
    pred = preds[0]
    # Dense outputs stay torch tensors on the engine's device (here the CPU).
    for dense in (pred.depth, pred.depth_conf, pred.image):
        assert isinstance(dense, torch.Tensor) and dense.device == torch.device('cpu')
    assert tuple(pred.depth.shape) == (56, 112) and tuple(pred.depth_conf.shape) == (56, 112)
    assert pred.depth.dtype == pred.depth_conf.dtype == torch.float32
    assert bool((pred.depth > 0).all()) and bool((pred.depth_conf >= 1).all())
    assert tuple(pred.image.shape) == (56, 112, 3) and pred.image.dtype == torch.uint8
    # The colours are the image the network ran on, which the prediction carries as well.
    assert tuple(pred.network_input.shape) == (3, 56, 112)
    np.testing.assert_array_equal(
        pred.image.numpy(),
        (pred.network_input.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy())
    assert pred.tag.stamp_ns == pred.stamp_ns == 10 and pred.preprocess.image_size_hw == (56, 112)
    # 128x64 (W x H) becomes 112x56: both focal lengths scale by 128/112 = 64/56.
    assert pred.intrinsics_original[1, 1] == pytest.approx(pred.intrinsics[1, 1] * 64 / 56)
    assert pred.intrinsics_original[0, 0] == pytest.approx(pred.intrinsics[0, 0] * 128 / 112)
    assert session.flush() == []


def test_a_saved_checkpoint_reproduces_the_session_it_came_from(tmp_path):
    from safetensors.torch import save_file

    source = StreamingSession(_config(), allow_random_weights=True, seed=4)
    path = tmp_path / 'tiny.safetensors'
    save_file({k: v.contiguous() for k, v in source.model.state_dict().items()}, str(path))
    loaded = StreamingSession(_config(), path)
    assert loaded.weights == str(path)
    frames = random_frames(N_S + 2)
    for a, b in zip(_run(source, frames), _run(loaded, frames)):
        np.testing.assert_allclose(a.pose_enc, b.pose_enc, rtol=1e-5, atol=1e-6)


def test_fast_path_is_built_before_the_stream_and_leaves_no_trace():
    # stream.compile on the CPU: Inductor's C++ backend, the same warm-up as CUDA graphs get.
    frames = random_frames(N_S + 4)
    plain = _run(StreamingSession(_config(**{'stream.keyframe_interval': 2}),
                                  allow_random_weights=True, seed=7), frames)
    session = StreamingSession(_config(**{'stream.compile': True, 'stream.keyframe_interval': 2}),
                               allow_random_weights=True, seed=7)
    assert session.step(frames[0], tag=1_000) == []
    # Built at the first frame, before any streaming frame; the warm-up's frames are gone.
    assert session.engine.runner.batches.whole is not None
    stats = session.stats()
    assert stats.compiled is True
    assert stats.whole_frame_graphs is True  # backend sdpa: staged whole frames
    assert stats.fast_path == 'whole_frame' and stats.fast_path_fallbacks == 0
    assert (stats.frames_in, stats.frames_out, stats.keyframes) == (1, 0, 0)
    assert stats.cache.frame_count == 0 and stats.pending_frames == 1
    assert session.stream.state.camera.stats().num_frames == 0
    compiled = _run_from(session, frames, 1)
    assert [p.role for p in compiled] == [p.role for p in plain]
    assert [(p.frame_index, p.time_index) for p in compiled] == \
        [(p.frame_index, p.time_index) for p in plain]
    np.testing.assert_allclose(np.stack([p.pose_enc for p in compiled]),
                               np.stack([p.pose_enc for p in plain]), atol=1e-4)
    # Once per size: a reset does not build it again.
    whole = session.engine.runner.batches.whole
    session.reset()
    _run(session, frames[:N_S + 1])
    assert session.engine.runner.batches.whole is whole


def _run_from(session: StreamingSession, frames: list[np.ndarray], first: int) -> list:
    preds = []
    for i in range(first, len(frames)):
        preds.extend(session.step(frames[i], tag=1_000 + i))
    return preds


def test_fast_path_is_one_checked_mode_and_eager_on_the_cpu_without_compile():
    with pytest.raises(ValueError, match="stream.fast_path='graphs'"):
        _config(**{'stream.fast_path': 'graphs'})
    frames = random_frames(N_S + 1)
    for fast_path, compile_, want in (('whole_frame', False, 'eager'),
                                      ('eager', True, 'eager')):
        session = StreamingSession(_config(**{'stream.fast_path': fast_path,
                                              'stream.compile': compile_}),
                                   allow_random_weights=True)
        _run(session, frames)
        stats = session.stats()
        assert (stats.fast_path, stats.compiled, stats.cuda_graphs) == (want, False, False)
        assert session.engine.runner.batches.whole is None
        assert session.engine.runner.batches.captured == 0


def test_apply_config_takes_live_fields_and_refuses_the_others():
    session = StreamingSession(_config(), allow_random_weights=True)
    assert session.stats().cache is None  # no frame yet: no cache to report
    session.apply_config(_config(**{'stream.keyframe_interval': 3, 'stream.enable_depth': False}))
    assert session.config.stream.keyframe_interval == 3
    assert session.config.stream.enable_depth is False
    with pytest.raises(ValueError, match='only stream.keyframe_interval'):
        session.apply_config(_config(**{'cache.sliding_window': WINDOW + 1}))
    assert session.config.cache.sliding_window == WINDOW  # unchanged after a refusal
    preds = _run(session, random_frames(N_S + 4))
    assert [p.role for p in preds[N_S:]] == ['keyframe', 'non-keyframe', 'non-keyframe',
                                             'keyframe']


def test_overlap_work_runs_after_the_frames_model_call_and_before_its_prediction():
    # A rollover's preparation runs here (rollover.py): after the frame's cache work, before
    # the session counts the frame; never for a buffered scale frame or a frame that raised.
    session = StreamingSession(_config(), allow_random_weights=True, seed=0)
    seen = []

    def overlap() -> None:
        stats = session.stats()
        seen.append((stats.frames_out, stats.keyframes, stats.cache.frame_count))

    frames = random_frames(N_S + 3)
    out = []
    for i, frame in enumerate(frames):
        tensor, info, _ = session.preprocess(frame)
        out.extend(session.step_tensor(tensor, info, i, overlap=overlap))
    assert [p.stamp_ns for p in out] == list(range(N_S + 3))
    # Streaming frames N_s.. : the frame is cached already, not counted yet.
    assert seen == [(N_S + i, N_S + i, N_S + i + 1) for i in range(3)]
    small, info, _ = session.preprocess(random_frame(size=(128, 128)))
    with pytest.raises(ResolutionChangedError):
        session.step_tensor(small, info, 99, overlap=overlap)
    assert len(seen) == 3
