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
"""Several streams on one engine: one model, one KV page pool, each stream as if alone.

Run: ``python -m pytest test/engine/test_engine_streams.py`` (tiny random-weight model, CPU).

Bit-identity is checked with exact equality on purpose: both runs are this process, on this
CPU, with the same kernels in the same order; only where the stream's pages sit in the pool
differs. Any difference means a stream saw another stream's keys (or its own wrongly placed).
"""

from __future__ import annotations

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.cache.stream_kv import prep_pages, stream_pages
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.errors import CachePoolExhaustedError, PoolExhaustedError
from lingbot_map_ros.engine.session.pipeline import StreamingSession
import numpy as np
import pytest
from tiny_engine import random_frame, random_frames, tiny_config

N_S, WINDOW, FRAMES = 2, 2, 16
PAGE = (56 // 14) * (112 // 14)  # patches of a 56 x 112 frame: one page
PER_STREAM = stream_pages(PAGE, 6, N_S, WINDOW, FRAMES)
PREP = prep_pages(PAGE, 6, N_S)  # each stream's headroom for its rollover's next session


def _config(**overrides) -> EngineConfig:
    return tiny_config({'stream.keyframe_interval': 2, 'stream.enable_depth': True,
                        'cache.scale_frames': N_S, 'cache.sliding_window': WINDOW,
                        'cache.max_total_frames': FRAMES, 'stream.session_keyframes': FRAMES,
                        'stream.overlap_keyframes': N_S}, overrides)


def _engine(**overrides) -> Engine:
    return Engine.load(_config(**overrides), allow_random_weights=True, seed=5)


def _alone(frames: list[np.ndarray]) -> list:
    session = StreamingSession(_config(), allow_random_weights=True, seed=5)
    return [p for i, f in enumerate(frames) for p in session.step(f, i)]


def _assert_same(got: list, want: list) -> None:
    assert [(p.frame_index, p.role, p.time_index) for p in got] == \
        [(p.frame_index, p.role, p.time_index) for p in want]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.pose_enc, b.pose_enc)
        np.testing.assert_array_equal(a.depth, b.depth)


def test_two_streams_interleaved_on_one_pool_equal_each_stream_alone():
    # N_s 2, W 2, K 2 over 9 frames: the window fills, keyframes evict, non-keyframes roll back.
    frames_a, frames_b = random_frames(N_S + 7, seed=1), random_frames(N_S + 7, seed=2)
    engine = _engine(**{'cache.streams': 2})
    a = StreamingSession(engine.config, engine=engine)
    b = StreamingSession(engine.config, engine=engine)
    got_a, got_b = [], []
    for i, (frame_a, frame_b) in enumerate(zip(frames_a, frames_b)):
        got_a += a.step(frame_a, i)
        got_b += b.step(frame_b, i)
    assert a.model is b.model  # weights loaded once
    pool = engine.pool
    assert pool is not None and pool.num_pages == 2 * (PER_STREAM + PREP)
    stats_a, stats_b = a.stats().cache, b.stats().cache
    assert (stats_a.pool_pages_total, stats_a.pool_pages_free, stats_a.pool_streams) == \
        (2 * (PER_STREAM + PREP), 2 * PREP, 2)
    assert stats_a.live_pages == stats_b.live_pages == WINDOW
    # The two leases are disjoint extents: every page is held by exactly one of them.
    leases = [s.stream.state.kv.lease for s in (a, b)]
    assert {pool.owner(p) for p in range(pool.num_pages)} - {-1} == \
        {le.stream for le in leases}
    assert leases[0].first_page + leases[0].num_pages <= leases[1].first_page
    _assert_same(got_a, _alone(frames_a))
    _assert_same(got_b, _alone(frames_b))
    # Poses move from frame to frame, so equality is not a constant output.
    poses = np.stack([p.pose_enc for p in got_b])
    assert np.abs(np.diff(poses, axis=0)).max() > 1e-4


def test_a_full_pool_refuses_a_stream_before_writing_and_the_others_go_on():
    frames_a, frames_b, frames_c = (random_frames(N_S + 5, seed=s) for s in (1, 2, 3))
    engine = _engine(**{'cache.streams': 2})
    a = StreamingSession(engine.config, engine=engine)
    b = StreamingSession(engine.config, engine=engine)
    c = StreamingSession(engine.config, engine=engine)
    got_a, got_b = [], []
    for i in range(N_S + 1):
        got_a += a.step(frames_a[i], i)
        got_b += b.step(frames_b[i], i)
    pool = engine.pool
    before = [pool.storage.k[layer].clone() for layer in range(pool.storage.num_layers)]
    with pytest.raises(PoolExhaustedError, match='KV page pool full') as refused:
        c.step(frames_c[0], 0)
    assert isinstance(refused.value, CachePoolExhaustedError)  # a session limit: drop, go on
    # Refused before anything was written: the pool's pages are bit for bit as they were.
    for layer, keys in enumerate(before):
        assert pool.storage.k[layer].equal(keys)
    assert c.stats().cache is None and c.stats().frames_in == 0  # never held pages
    assert engine.pool_stats().pool_streams == 2
    for i in range(N_S + 1, N_S + 5):
        got_a += a.step(frames_a[i], i)
        got_b += b.step(frames_b[i], i)
    _assert_same(got_a, _alone(frames_a))
    _assert_same(got_b, _alone(frames_b))
    # A reset returns a stream's pages: the refused stream gets them and runs as if alone.
    a.reset()
    assert engine.pool_stats().pool_pages_free == PER_STREAM + 2 * PREP
    assert a.stats().cache.frame_count == 0 and a.stats().cache.pool_streams == 1
    got_c = [p for i, f in enumerate(frames_c) for p in c.step(f, i)]
    _assert_same(got_c, _alone(frames_c))


def test_pool_size_follows_the_configuration():
    engine = _engine(**{'cache.pool_pages': PER_STREAM + 3})
    session = StreamingSession(engine.config, engine=engine)
    assert engine.pool_stats().pool_pages_total == 0  # no pool before the first frame
    session.step(random_frame(1), 0)
    assert engine.pool_stats().pool_pages_total == PER_STREAM + 3
    assert engine.pool_stats().pool_pages_free == 3
    session.close()
    assert engine.pool_stats().pool_streams == 0
    with pytest.raises(ValueError, match='another configuration'):
        StreamingSession(_config(**{'cache.sliding_window': WINDOW + 1}), engine=engine)
