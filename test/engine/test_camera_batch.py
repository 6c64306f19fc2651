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
"""Frames of several cameras fed as one batch equal each camera fed alone.

Run: ``python -m pytest test/engine/test_camera_batch.py`` (tiny random-weight model, CPU).

Floats are compared with a tight tolerance (1e-5 relative): the batched GEMMs see B*P rows
instead of P, and a BLAS may block them differently. On the CPUs we ran (x86, MKL/OpenBLAS)
the results were bit-identical.
"""

from __future__ import annotations

import dataclasses

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.cameras.camera_batch import BatchStats, feed_batch
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.reasons import Reason
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.engine.session.stream_feeder import StreamFeeder
# The benchmark's driver of preprocessed frames (bench model --cameras N), checked here too.
from lingbot_map_ros.tools.bench_cameras import step_batch
import numpy as np
import pytest
from tiny_engine import random_frames, tiny_config
import torch

N_S, WINDOW, FRAMES = 2, 2, 16
STEP_NS = 100_000_000


def _config(**overrides) -> EngineConfig:
    return tiny_config({'stream.keyframe_interval': 2, 'stream.enable_depth': True,
                        'cache.scale_frames': N_S, 'cache.sliding_window': WINDOW,
                        'cache.max_total_frames': FRAMES, 'stream.session_keyframes': 5,
                        'stream.overlap_keyframes': N_S, 'cache.streams': 3}, overrides)


def _feeders(engine: Engine, count: int, rollover: bool = True) -> list[StreamFeeder]:
    def session():
        inner = StreamingSession(engine.config, engine=engine)
        return RolloverSession(inner) if rollover else inner
    return [StreamFeeder(session()) for _ in range(count)]


def _alone(frames: list, stamps: list[int], rollover: bool = True, **overrides) -> list:
    engine = Engine.load(_config(**overrides), allow_random_weights=True, seed=5)
    feeder = _feeders(engine, 1, rollover)[0]
    return [feeder.feed(f, s) for f, s in zip(frames, stamps)]


def _assert_same(got: list, want: list) -> None:
    """Check the feed results: predictions (values within tolerance), drops, resets, holds."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a.accepted, a.drop, a.held, a.held_drop) == (b.accepted, b.drop, b.held,
                                                             b.held_drop)
        assert [r.reason for r in a.resets] == [r.reason for r in b.resets]
        assert [(p.frame_index, p.role, p.time_index, p.session, p.tag) for p in a.predictions] \
            == [(p.frame_index, p.role, p.time_index, p.session, p.tag) for p in b.predictions]
        for p, q in zip(a.predictions, b.predictions):
            np.testing.assert_allclose(p.pose_enc, q.pose_enc, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(p.c2w, q.c2w, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(p.depth.numpy(), q.depth.numpy(), rtol=1e-5, atol=1e-6)


def _run(feeders: list[StreamFeeder], frames: list[list], stats: BatchStats) -> list[list]:
    got: list[list] = [[] for _ in feeders]
    for i in range(len(frames[0])):
        results = feed_batch(feeders, [f[i] for f in frames], [i * STEP_NS] * len(feeders),
                             stats)
        for k, result in enumerate(results):
            got[k].append(result)
    return got


@pytest.mark.parametrize('cameras', [2, 3])
def test_cameras_batched_equal_each_camera_alone(cameras):
    # 9 frames, K 2, 5 keyframes a session: scale phase, window eviction, non-keyframes rolled
    # back, and a rollover (its scale pass alone) in every stream.
    count = N_S + 7
    frames = [random_frames(count, seed=s) for s in range(1, cameras + 1)]
    engine = Engine.load(_config(), allow_random_weights=True, seed=5)
    feeders = _feeders(engine, cameras)
    stats = BatchStats()
    got = _run(feeders, frames, stats)
    stamps = [i * STEP_NS for i in range(count)]
    for k in range(cameras):
        alone_engine = Engine.load(_config(), allow_random_weights=True, seed=5)
        alone = _feeders(alone_engine, 1)[0]
        _assert_same(got[k], [alone.feed(f, s) for f, s in zip(frames[k], stamps)])
        assert feeders[k].session.rollover_stats().rollovers == 1
        assert dataclasses.asdict(feeders[k].session.stats().cache) == dict(
            dataclasses.asdict(alone.session.stats().cache),
            pool_pages_total=engine.pool_stats().pool_pages_total,
            pool_pages_free=engine.pool_stats().pool_pages_free,
            # Each camera holds what it holds alone: its stream and, after a rollover, the spare.
            pool_streams=cameras * alone_engine.pool_stats().pool_streams)
    assert stats.batches > 0 and stats.batched_frames >= 2 * stats.batches
    assert stats.batched_frames + stats.alone_frames == cameras * count


def test_staged_whole_batches_through_the_engine_equal_each_camera_alone():
    # The whole-frame fast path as the engine runs it, eager on the CPU: every batch stages
    # each stream's frame in a slot of its own (runner/whole_batch.py), across window fills,
    # evictions and a rollover per stream.
    count = N_S + 7
    frames = [random_frames(count, seed=s) for s in (1, 2)]
    engine = Engine.load(_config(), allow_random_weights=True, seed=5)
    engine.fast_path.request('whole_frame', False)
    feeders = _feeders(engine, 2)
    stats = BatchStats()
    got = _run(feeders, frames, stats)
    stamps = [i * STEP_NS for i in range(count)]
    for k in range(2):
        _assert_same(got[k], _alone(frames[k], stamps))
    whole = engine.runner.batches.whole
    assert engine.fast_path.mode.aggregator == 'whole_frame', engine.fast_path.mode.reason
    assert sum(engine.fast_path.fallbacks().values()) == 0
    # Batches of two, and of one (a stream streaming beside the other's rollover, warm-up).
    assert stats.batches > 0 and whole is not None and whole.batches > stats.batches


def test_a_camera_in_its_scale_phase_runs_alone_beside_streaming_ones():
    count = N_S + 5
    frames_a, frames_b = random_frames(count, seed=1), random_frames(count, seed=2)
    engine = Engine.load(_config(), allow_random_weights=True, seed=5)
    a, b = _feeders(engine, 2, rollover=False)
    stats = BatchStats()
    got_a, got_b = [], []
    late = 3  # b starts when a already streams: b's scale frames run alone
    for i in range(count):
        if i < late:
            got_a += feed_batch([a], [frames_a[i]], [i * STEP_NS], stats)
            continue
        res = feed_batch([a, b], [frames_a[i], frames_b[i - late]], [i * STEP_NS] * 2, stats)
        got_a.append(res[0])
        got_b.append(res[1])
    stamps = [i * STEP_NS for i in range(count)]
    _assert_same(got_a, _alone(frames_a, stamps, rollover=False))
    _assert_same(got_b, _alone(frames_b[:count - late], stamps[late:], rollover=False))
    # b's two scale frames ran while a streamed: those steps of a ran alone too.
    assert stats.batches == count - late - N_S


def test_a_bad_frame_in_one_camera_does_not_disturb_the_others():
    count = N_S + 4
    frames = [random_frames(count, seed=s) for s in (1, 2, 3)]
    bad = frames[1][N_S + 1] = np.zeros((0, 5, 3), np.uint8)  # an empty image
    assert bad.size == 0
    stamps = [[i * STEP_NS for i in range(count)] for _ in range(3)]
    stamps[2][N_S + 2] = stamps[2][N_S + 1]  # a duplicate stamp: dropped, stream unchanged
    engine = Engine.load(_config(), allow_random_weights=True, seed=5)
    feeders = _feeders(engine, 3)
    got: list[list] = [[], [], []]
    for i in range(count):
        results = feed_batch(feeders, [f[i] for f in frames], [s[i] for s in stamps])
        for k, result in enumerate(results):
            got[k].append(result)
    assert got[1][N_S + 1].drop.reason is Reason.INVALID_FRAME
    assert got[2][N_S + 2].drop.reason is Reason.STAMP_OUT_OF_ORDER
    for k in range(3):
        _assert_same(got[k], _alone(frames[k], stamps[k]))


def test_a_full_pool_refuses_a_third_camera_typed_and_the_others_go_on():
    count = N_S + 3
    frames = [random_frames(count, seed=s) for s in (1, 2, 3)]
    engine = Engine.load(_config(**{'cache.streams': 2}), allow_random_weights=True, seed=5)
    feeders = _feeders(engine, 3)
    got = _run(feeders, frames, BatchStats())
    for result in got[2]:
        # A session limit: reset, fed once more, refused again; never accepted.
        assert not result.accepted and not result.predictions
        assert [r.reason for r in result.resets] == [Reason.CACHE_FULL] * 2
        assert 'KV page pool full' in result.resets[0].detail
    # The refused camera holds nothing: the pool is as two cameras leave it without a third.
    two = Engine.load(_config(**{'cache.streams': 2}), allow_random_weights=True, seed=5)
    _run(_feeders(two, 2), frames[:2], BatchStats())
    assert engine.pool_stats() == two.pool_stats()
    stamps = [i * STEP_NS for i in range(count)]
    for k in range(2):
        _assert_same(got[k], _alone(frames[k], stamps, **{'cache.streams': 2}))


def test_step_batch_of_preprocessed_frames_equals_step_tensor():
    count = N_S + 3
    frames = [random_frames(count, seed=s) for s in (1, 2)]
    engine = Engine.load(_config(), allow_random_weights=True, seed=5)
    sessions = [StreamingSession(engine.config, engine=engine) for _ in range(2)]
    alone = StreamingSession(_config(), allow_random_weights=True, seed=5)
    stats = BatchStats()
    for i in range(count):
        inputs = [s.preprocess(f[i])[:2] + (i,) for s, f in zip(sessions, frames)]
        preds = step_batch(sessions, inputs, stats)
        want = alone.step(frames[1][i], i)
        assert [p.frame_index for p in preds[1]] == [p.frame_index for p in want]
        for p, q in zip(preds[1], want):
            np.testing.assert_allclose(p.pose_enc, q.pose_enc, rtol=1e-5, atol=1e-6)
    assert stats.batches == count - N_S


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_batched_cuda_graphs_equal_each_stream_alone_in_bf16():
    # bf16, whole-frame fast path: a batch of two replays one captured graph (segments and
    # both streams' staged cache attention); each stream alone runs the plain eager forward.
    # Batched GEMMs pick other kernels (B*P rows), staged attention flash varlen / cuDNN:
    # bf16 noise.
    count = N_S + 6
    frames = [random_frames(count, seed=s) for s in (1, 2)]
    cuda = {'stream.device': 'cuda', 'stream.dtype': 'bfloat16', 'cache.dtype': 'bfloat16',
            'stream.fast_path': 'whole_frame'}
    engine = Engine.load(_config(**cuda), allow_random_weights=True, seed=5)
    sessions = [StreamingSession(engine.config, engine=engine) for _ in range(2)]
    stats = BatchStats()
    got = [[], []]
    for i in range(count):
        inputs = [s.preprocess(f[i])[:2] + (i,) for s, f in zip(sessions, frames)]
        for k, preds in enumerate(step_batch(sessions, inputs, stats)):
            got[k] += preds
    assert stats.batches == count - N_S
    batches = engine.runner.batches
    assert sum(engine.fast_path.fallbacks().values()) == 0, engine.fast_path.mode.reason
    assert batches.captured == 0 and batches.whole.captured >= 1
    # The warm-up's keyframe and non-keyframe ran whole too, each a batch of one.
    assert batches.whole.batches == stats.batches + 2
    for k in range(2):
        alone = StreamingSession(_config(**dict(cuda, **{'stream.fast_path': 'eager'})),
                                 allow_random_weights=True, seed=5)
        want = [p for i, f in enumerate(frames[k]) for p in alone.step(f, i)]
        assert [p.role for p in got[k]] == [p.role for p in want]
        for p, q in zip(got[k], want):
            np.testing.assert_allclose(p.pose_enc, q.pose_enc, rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(p.depth, q.depth, rtol=2e-2, atol=2e-2)
