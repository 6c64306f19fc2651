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

Tiny random-weight engine on the CPU (eager: no graphs, so no graph ranges). A recording
profiler notes each range's name and nesting depth as it opens.

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


def test_a_streaming_frame_opens_the_named_ranges_in_order():
    engine = Engine.load(_config(), allow_random_weights=True)
    session = StreamingSession(engine.config, engine=engine)
    frames = random_frames(N_S + 1)
    for i, frame in enumerate(frames[:N_S]):
        session.step(frame, i)  # the scale phase: not through forward_frame
    recorder = Recorder()
    engine.set_profiler(recorder)
    assert engine.profiler is recorder
    session.step(frames[N_S], N_S)
    assert recorder.opened == [('forward frame', 0), ('aggregator', 1), ('prepare', 2),
                               ('camera head', 1), ('depth head', 1)]
    assert {name for name, _ in recorder.opened} <= set(STEPS)


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


def test_a_batch_opens_prepare_per_frame_then_the_batched_forward():
    engine = Engine.load(_config(), allow_random_weights=True)
    feeders = [StreamFeeder(StreamingSession(engine.config, engine=engine)) for _ in range(2)]
    frames = random_frames(N_S + 1)
    for i in range(N_S):
        feed_batch(feeders, [frames[i]] * 2, [1_000 + i] * 2)
    recorder = Recorder()
    engine.set_profiler(recorder)
    feed_batch(feeders, [frames[N_S]] * 2, [1_000 + N_S] * 2)
    # The lanes issue the batch's depth head first, then each stream's camera head.
    assert recorder.opened == [('prepare', 0), ('prepare', 0), ('forward batch', 0),
                               ('lanes', 1), ('depth head', 2), ('camera head', 2),
                               ('camera head', 2)]


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
def test_whole_frame_graphs_open_stage_launch_and_unstage_inside_the_frame_graph():
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
    graph = names.index('frame graph')
    depth = dict(recorder.opened)['frame graph']
    assert names[graph + 1:graph + 4] == ['stage', 'graph launch', 'unstage']
    assert [d for _, d in recorder.opened[graph + 1:graph + 4]] == [depth + 1] * 3
    assert names.index('camera head') > graph
