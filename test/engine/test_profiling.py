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
"""The engine's step ranges (``engine/profiling.py``): what a profiler set on the engine sees.

Tiny random-weight engine on the CPU. Its mode is 'eager' unless a test asks for the batch path
('segments', 'whole_frame'), which the CPU runs uncaptured: the same ranges as on the GPU except
the graph launches (no graphs here) and the wait for the device. A recording profiler notes each
range's name and nesting depth as it opens.

Run: ``python -m pytest test/engine/test_profiling.py`` (a few seconds).
"""

from __future__ import annotations

import contextlib

from lingbot_map_ros.engine.cameras.camera_batch import feed_batch
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.profiling import step_range, STEPS
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.stream_feeder import StreamFeeder
import pytest
from tiny_engine import random_frames, tiny_config
import torch

N_S = 2


class Recorder:
    """Notes ``(name, depth)`` of every range as it opens."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, int]] = []
        self._depth = 0

    @contextlib.contextmanager
    def span(self, name: str):
        self.opened.append((name, self._depth))
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1


def _config(**overrides):
    return tiny_config({'cache.scale_frames': N_S, 'cache.sliding_window': 2,
                        'stream.keyframe_interval': 2, 'stream.enable_depth': True,
                        'cache.streams': 2}, overrides)


def _poses(session: StreamingSession, frames) -> list[torch.Tensor]:
    return [torch.as_tensor(p.pose_enc) for i, f in enumerate(frames)
            for p in session.step(f, i)]


# What one streaming frame (a batch of one) opens in each mode, in order (runner/runner.py,
# runner/whole_batch.py): 'prepare' before any run; the aggregator of a batch inside its
# 'forward batch'; a whole batch stages each frame, runs the batch graph (its inputs inside)
# and unstages after it; then the lanes, the depth head issued before the camera head.
FRAME_RANGES = {
    'eager': [('prepare', 0), ('forward eager', 0)],
    'segments': [('prepare', 0), ('forward batch', 0), ('aggregator', 1), ('lanes', 1),
                 ('depth head', 2), ('camera head', 2)],
    'whole_frame': [('prepare', 0), ('forward batch', 0), ('aggregator', 1), ('stage', 2),
                    ('batch graph', 2), ('batch inputs', 3), ('unstage', 2), ('lanes', 1),
                    ('depth head', 2), ('camera head', 2)],
}


def _engine(mode: str) -> Engine:
    """Return a tiny engine whose jobs run in ``mode`` (asked before the first frame)."""
    engine = Engine.load(_config(), allow_random_weights=True)
    engine.fast_path.request(mode, False)
    return engine


@pytest.mark.parametrize('mode', sorted(FRAME_RANGES))
def test_a_streaming_frame_opens_the_named_ranges_in_order(mode):
    engine = _engine(mode)
    session = StreamingSession(engine.config, engine=engine)
    frames = random_frames(N_S + 1)
    for i, frame in enumerate(frames[:N_S]):
        session.step(frame, i)  # the scale phase: a job of its own
    recorder = Recorder()
    engine.set_profiler(recorder)
    assert engine.profiler is recorder
    session.step(frames[N_S], N_S)
    assert engine.fast_path.mode.aggregator == mode  # no step-down: the mode's own path ran
    assert recorder.opened == FRAME_RANGES[mode]
    assert {name for name, _ in recorder.opened} <= set(STEPS)


def test_a_scale_pass_runs_alone_on_the_eager_forward_whatever_the_mode():
    engine = _engine('whole_frame')
    frames = random_frames(N_S)
    session = StreamingSession(engine.config, engine=engine)
    session.step(frames[0], 0)  # the engine's warm-up (its own scale pass) runs here
    session.reset()
    recorder = Recorder()
    engine.set_profiler(recorder)
    for i, frame in enumerate(frames):
        session.step(frame, i)  # the last of the N_s frames runs the scale pass
    assert engine.fast_path.mode.aggregator == 'whole_frame'
    assert recorder.opened == [('prepare', 0), ('forward eager', 0)]


def test_ranges_record_only_inside_the_engine_that_set_them():
    engine = Engine.load(_config(), allow_random_weights=True)
    recorder = Recorder()
    engine.set_profiler(recorder)
    with step_range('prepare'):  # outside any engine call: nothing active
        pass
    assert recorder.opened == []
    other = StreamingSession(_config(), allow_random_weights=True)  # an engine of its own
    for i, frame in enumerate(random_frames(N_S + 1)):
        other.step(frame, i)
    assert recorder.opened == []
    engine.set_profiler(None)
    session = StreamingSession(engine.config, engine=engine)
    for i, frame in enumerate(random_frames(N_S + 1)):
        session.step(frame, i)
    assert recorder.opened == []


# Two streams' frames in one run: each job is prepared, then the batch path runs them as one
# batch (a whole batch stages and unstages each stream's frame around its one graph; the
# depth head once for the batch, a camera head per stream); 'eager' runs the segments'
# batch uncaptured.
_SEGMENT_RANGES = [('prepare', 0), ('prepare', 0), ('forward batch', 0), ('aggregator', 1),
                   ('lanes', 1), ('depth head', 2), ('camera head', 2), ('camera head', 2)]
BATCH_RANGES = {
    'eager': _SEGMENT_RANGES,
    'segments': _SEGMENT_RANGES,
    'whole_frame': [('prepare', 0), ('prepare', 0), ('forward batch', 0), ('aggregator', 1),
                    ('stage', 2), ('stage', 2), ('batch graph', 2), ('batch inputs', 3),
                    ('unstage', 2), ('unstage', 2), ('lanes', 1), ('depth head', 2),
                    ('camera head', 2), ('camera head', 2)],
}


@pytest.mark.parametrize('mode', sorted(BATCH_RANGES))
def test_a_batch_opens_prepare_per_frame_then_the_forward(mode):
    engine = _engine(mode)
    feeders = [StreamFeeder(StreamingSession(engine.config, engine=engine)) for _ in range(2)]
    frames = random_frames(N_S + 1)
    for i in range(N_S):
        feed_batch(feeders, [frames[i]] * 2, [1_000 + i] * 2)
    recorder = Recorder()
    engine.set_profiler(recorder)
    feed_batch(feeders, [frames[N_S]] * 2, [1_000 + N_S] * 2)
    assert recorder.opened == BATCH_RANGES[mode]


@pytest.mark.parametrize('profiled', [False, True])
def test_outputs_are_bitwise_those_of_an_engine_without_a_profiler(profiled):
    frames = random_frames(N_S + 4, seed=3)
    plain = _poses(StreamingSession(_config(), allow_random_weights=True, seed=4), frames)
    engine = Engine.load(_config(), allow_random_weights=True, seed=4)
    recorder = Recorder()
    if profiled:
        engine.set_profiler(recorder)
    got = _poses(StreamingSession(engine.config, engine=engine), frames)
    assert len(got) == len(plain) == N_S + 4
    assert all(torch.equal(a, b) for a, b in zip(got, plain))
    assert (len(recorder.opened) > 0) == profiled


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_whole_batch_graphs_stage_launch_inside_the_batch_graph_and_unstage():
    config = _config(**{'stream.device': 'cuda', 'stream.dtype': 'bfloat16',
                        'cache.dtype': 'bfloat16', 'stream.fast_path': 'whole_frame'})
    engine = Engine.load(config, allow_random_weights=True)
    session = StreamingSession(engine.config, engine=engine)
    frames = random_frames(N_S + 4)
    for i, frame in enumerate(frames[:N_S + 3]):
        session.step(frame, i)  # scale phase, then graphs captured
    assert session.stats().fast_path == 'whole_frame'
    recorder = Recorder()
    engine.set_profiler(recorder)
    session.step(frames[N_S + 3], N_S + 3)
    names = [name for name, _ in recorder.opened]
    depths = [depth for _, depth in recorder.opened]
    assert recorder.opened[:3] == [('prepare', 0), ('forward batch', 0), ('aggregator', 1)]
    # The frame is staged before its graph and unstaged after it, beside it in the
    # aggregator; the batch's inputs and the one graph replay inside it.
    graph = names.index('batch graph')
    assert names[graph - 1:graph + 4] == [
        'stage', 'batch graph', 'batch inputs', 'graph launch', 'unstage']
    assert depths[graph - 1:graph + 4] == [2, 2, 3, 3, 2]
    # Then the heads on the lanes (their captured steps launch inside), and the wait.
    assert names.index('lanes') > graph and depths[names.index('lanes')] == 1
    assert names.index('camera head') > graph and names.index('depth head') > graph
    assert recorder.opened[-1] == ('wait (sync)', 0)
    assert names.count('graph launch') == 3  # the batch graph, the depth and camera heads
    assert set(names) <= set(STEPS)
