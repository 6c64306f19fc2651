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
"""One path per level: every model call of a session is a job run through ``Engine.run``.

A session's step, a rollover's step and a feeder's feed plan a job, run it as a batch of one
and take its outcome; one camera fed through ``feed_batch`` is the same path. Tiny random-weight
engine on the CPU.

Run: ``python -m pytest test/engine/test_session_jobs.py``.
"""

from __future__ import annotations

from lingbot_map_ros.engine.cameras.camera_batch import BatchStats, feed_batch
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.errors import CacheStateError
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.engine.session.stream_feeder import StreamFeeder
import numpy as np
import pytest
from tiny_engine import random_frames, tiny_config
import torch

N_S = 2
STEP_NS = 100_000_000


def _config(**overrides):
    return tiny_config({'cache.scale_frames': N_S, 'stream.keyframe_interval': 2,
                        'stream.enable_depth': True, 'cache.sliding_window': 2,
                        'cache.max_total_frames': 16, 'stream.session_keyframes': 5,
                        'stream.overlap_keyframes': N_S}, overrides)


def _recorded(engine: Engine) -> list[tuple[str, ...]]:
    """Record the modes of the jobs of every ``engine.run`` call (wraps the instance's)."""
    calls: list[tuple[str, ...]] = []
    run = engine.run

    def recording_run(jobs, overlap=None):
        calls.append(tuple(job.mode for job in jobs))
        return run(jobs, overlap)
    engine.run = recording_run
    return calls


def test_a_sessions_every_model_call_is_one_engine_run():
    session = StreamingSession(_config(), allow_random_weights=True, seed=3)
    calls = _recorded(session.engine)
    frames = random_frames(N_S + 3, seed=1)
    counts = []
    for i, frame in enumerate(frames):
        counts.append(len(session.step(frame, i)))
    # Buffered, then the scale pass's N_s predictions, then one per frame.
    assert counts == [0] * (N_S - 1) + [N_S, 1, 1, 1]
    assert calls == [('scale',), ('keyframe',), ('non-keyframe',), ('keyframe',)]
    # flush: a shorter scale phase is a scale job too.
    session.reset()
    calls.clear()
    assert session.step(frames[0], 100) == []
    assert [p.stamp_ns for p in session.flush()] == [100]
    assert calls == [('scale',)]


def test_a_rollovers_preparation_runs_as_the_overlap_of_its_frames_engine_run():
    session = StreamingSession(_config(), allow_random_weights=True, seed=3)
    rollover = RolloverSession(session)
    engine = session.engine
    run, inside = engine.run, []

    def recording_run(jobs, overlap=None):
        def watched() -> None:
            inside.append(len(jobs))
            overlap()
        return run(jobs, None if overlap is None else watched)
    engine.run = recording_run
    prepared = []
    for i, frame in enumerate(random_frames(N_S + 10, seed=2)):
        prepared += ['prepare' in p.timings_ms
                     for p in rollover.step(frame, i) if p.role != 'scale']
    assert rollover.rollover_stats().rollovers == 1
    # Every streaming frame's run (a batch of one) carried the rollover's overlap work, and
    # the preparation's units ran in it.
    assert inside == [1] * len(prepared)
    assert any(prepared)


@pytest.mark.parametrize('rollover', [False, True])
def test_a_feeders_feed_equals_feed_batch_of_one_bitwise(rollover):
    frames = random_frames(N_S + 9, seed=4)
    stamps = [i * STEP_NS for i in range(len(frames))]
    stamps[5] = stamps[4]  # a duplicate: dropped
    stamps[8] = stamps[7] + 50 * 10**9  # far ahead: held, then dropped as an outlier

    def feeder() -> StreamFeeder:
        engine = Engine.load(_config(), allow_random_weights=True, seed=5)
        session = StreamingSession(engine.config, engine=engine)
        return StreamFeeder(RolloverSession(session) if rollover else session,
                            forward_jump_s=5.0)
    alone, batched = feeder(), feeder()
    stats = BatchStats()
    accepted, results = 0, []
    for frame, stamp in zip(frames, stamps):
        a = alone.feed(frame, stamp)
        [b] = feed_batch([batched], [frame], [stamp], stats)
        accepted += b.accepted
        results.append(b)
        assert (a.accepted, a.drop, a.held, a.held_drop) == (b.accepted, b.drop, b.held,
                                                             b.held_drop)
        assert [r.reason for r in a.resets] == [r.reason for r in b.resets]
        assert [(p.frame_index, p.role, p.time_index, p.tag) for p in a.predictions] == \
            [(p.frame_index, p.role, p.time_index, p.tag) for p in b.predictions]
        for p, q in zip(a.predictions, b.predictions):
            assert np.array_equal(p.pose_enc, q.pose_enc)
            assert np.array_equal(p.c2w, q.c2w)
            assert torch.equal(p.depth, q.depth)
    assert results[5].drop.reason == 'stamp_out_of_order' and results[8].held is not None
    assert results[9].held_drop.reason == 'stamp_jump_ahead' and results[9].accepted
    if rollover:
        assert batched.session.rollover_stats().rollovers == 1
    # One camera: no batch of several; each frame taken counts once.
    assert (stats.batches, stats.batched_frames, stats.alone_frames) == (0, 0, accepted)
    assert accepted == len(frames) - 2


def test_a_job_outlives_no_reset():
    session = StreamingSession(_config(), allow_random_weights=True, seed=3)
    for i, frame in enumerate(random_frames(N_S, seed=1)):
        session.step(frame, i)
    tensor, info, _ = session.preprocess(random_frames(1, seed=9)[0])
    job = session.frame_job(tensor, info, 50)
    [outcome] = session.engine.run([job.call])
    session.reset()
    with pytest.raises(CacheStateError, match='not the next call'):
        session.finish_job(job, outcome)
    assert session.stats().frames_out == 0
