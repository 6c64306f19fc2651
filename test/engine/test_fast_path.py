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
"""The fast path's one mode value and its counted step-downs (``engine/model/fast_path.py``).

Each step-down that can happen on the CPU is made to happen here (a stand-in for the refusing
compiler, capture or backend), and each test checks three things: the kind's counter, the mode
that runs afterwards, and outputs equal to the plain forward's (the step-down is slower, never
wrong). Only ``whole_frame`` needs a capture: a stand-in "capture" runs the function and
replays it by calling it again, which is what a graph replay does.

Run: ``python -m pytest test/engine/test_fast_path.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import logging

from lingbot_map_ros.config import ModelConfig
from lingbot_map_ros.engine.attention.sdpa import ReferenceBackend, SdpaBackend
from lingbot_map_ros.engine.model.fast_path import FastPathState
from lingbot_map_ros.engine.model.frame_runner import FrameRunner
from lingbot_map_ros.engine.stats import FALLBACK_KINDS
import numpy as np
import pytest
# tiny_engine and tiny_stream sit next to this file (pytest puts test/engine on sys.path).
from tiny_engine import random_images, tiny_session
from tiny_stream import run_stream, tiny_model
import torch

REFUSED = RuntimeError('operation not permitted when stream is capturing')


def _counted(state: FastPathState) -> dict[str, int]:
    """Return the non-zero counters."""
    return {kind: n for kind, n in state.fallbacks().items() if n}


def _plain_and_fast(mode: str, compile_: bool = False, frames: int = 5):
    """Return the plain forward's outputs, a fresh runner asking for ``mode``, its run."""
    images = random_images(frames, seed=0)
    model = tiny_model('cpu', torch.float32)
    plain = run_stream(model, images, FrameRunner.for_model(model), torch.float32)
    runner = FrameRunner.for_model(model, FastPathState(mode, compile_))
    return plain, runner, lambda: run_stream(model, images, runner, torch.float32)


def _assert_equal(plain: list[dict], fast: list[dict]) -> None:
    for a, b in zip(plain, fast):
        for key in ('pose_enc', 'depth'):
            torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=0)


def test_the_mode_is_one_value_that_each_step_down_lowers(caplog):
    state = FastPathState('whole_frame', True)
    assert state.mode.aggregator == 'segments'  # no pool bound yet: nothing to stage on
    state.bind(SdpaBackend(), True)
    before = state.mode
    assert (before.aggregator, before.compiled, before.reason) == ('whole_frame', True, '')
    assert before.head_on('camera head') and before.head_on('depth head')
    with caplog.at_level(logging.WARNING, logger='lingbot_map_ros.engine.model.fast_path'):
        state.fall_back('compile', REFUSED)
        state.fall_back('compile', REFUSED)
    assert len(caplog.records) == 1  # logged once per kind, counted every time
    assert state.mode.compiled is False and state.mode.heads_compile is True
    assert 'uncompiled' in state.mode.reason and before.compiled  # the old value is unchanged
    state.fall_back('camera_head', REFUSED)
    assert not state.mode.head_on('camera head') and state.mode.head_on('depth head')
    state.fall_back('whole_frame', REFUSED)
    assert state.mode.aggregator == 'segments'
    state.fall_back('capture', REFUSED)
    assert state.mode.aggregator == 'eager' and state.mode.requested == 'whole_frame'
    assert _counted(state) == {'compile': 2, 'camera_head': 1, 'whole_frame': 1, 'capture': 1}
    assert set(state.fallbacks()) == set(FALLBACK_KINDS)
    with pytest.raises(ValueError, match='step-down'):
        state.fall_back('no_such_kind', REFUSED)
    with pytest.raises(ValueError, match="'graphs'"):
        state.request('graphs', False)  # type: ignore[arg-type]
    # A tool that runs eagerly for a while puts the exact mode back; the counters stay.
    saved = state.mode
    state.request('eager', False)
    assert state.mode.aggregator == 'eager' and not state.mode.heads
    state.restore(saved)
    assert state.mode == saved and sum(state.fallbacks().values()) == 5


def test_a_segments_only_backend_caps_the_mode_without_a_fallback():
    state = FastPathState('whole_frame')
    state.bind(ReferenceBackend(), False, "backend 'reference' runs segments only")
    assert state.mode.aggregator == 'segments'
    assert state.mode.reason == "backend 'reference' runs segments only"
    assert _counted(state) == {}  # a configuration, not a step-down
    state.request('segments', False)
    assert state.mode.reason == ''  # nothing capped: segments is what was asked


def test_a_refused_cudnn_split_is_counted_as_an_attention_kernel_fallback():
    # cuDNN has no CPU kernel: the sdpa backend's split refuses here as it would on a GPU
    # whose cuDNN cannot run the shape, steps down to plain SDPA and counts it.
    backend = SdpaBackend(full_patch_pages=2)
    state = FastPathState('whole_frame')
    state.bind(backend, True)
    q, k = torch.randn(4, 2, 8), torch.randn(10, 2, 8)
    assert backend.split(q, k, k, 5) is None and not backend.split.enabled
    assert _counted(state) == {'attention_kernel': 1}
    state.bind(SdpaBackend(), True)  # a replaced pool's backend: its step-downs stay counted
    assert _counted(state) == {'attention_kernel': 1}
    assert state.mode.aggregator == 'whole_frame'  # the backend's own choice, not the mode's


def test_the_session_reports_every_counter_by_name():
    session = tiny_session()
    frame = np.full((64, 128, 3), 128, np.uint8)
    session.step(frame, tag=1_000)
    stats = session.stats()
    assert stats.fallbacks == dict.fromkeys(FALLBACK_KINDS, 0)
    assert (stats.fast_path_requested, stats.fast_path, stats.fast_path_reason) == \
        ('eager', 'eager', '')  # the CPU without compile
    q, k = torch.randn(4, 2, 8), torch.randn(10, 2, 8)
    assert session.engine.pool.backend.split(q, k, k, 5) is None
    stats = session.stats()
    assert stats.fallbacks['attention_kernel'] == 1 and stats.fast_path_fallbacks == 1


def test_a_runner_that_cannot_be_built_falls_back_to_the_plain_forward(monkeypatch):
    import lingbot_map_ros.engine.model.frame_runner as frame_runner_module

    def refuse(*_args, **_kwargs):
        raise REFUSED

    plain, runner, run = _plain_and_fast('whole_frame')
    monkeypatch.setattr(frame_runner_module, 'FrameGraphs', refuse)
    _assert_equal(plain, run())
    fast = runner.fast_path.mode
    assert fast.requested == 'whole_frame' and fast.aggregator == 'eager'
    assert _counted(runner.fast_path) == {'capture': 1}
    assert 'eagerly' in fast.reason and 'capturing' in fast.reason
    # The heads' fast path is independent of the aggregator's.
    assert fast.head_on('camera head') and runner.head_step_built('camera head')


def test_a_failed_compilation_runs_uncompiled_and_a_failed_head_runs_eagerly(monkeypatch):
    # A compiler that refuses everything: the segments run uncompiled, the depth head (whose
    # step is compiled) eagerly; the camera head's step is never compiled and stays on.
    import lingbot_map_ros.engine.model.captured as captured_module
    import lingbot_map_ros.engine.model.graphed as graphed_module

    def no_compiler(fn, enabled):
        if enabled:
            raise RuntimeError('Inductor: no C++ compiler')
        return fn

    plain, runner, run = _plain_and_fast('whole_frame', compile_=True)
    monkeypatch.setattr(graphed_module, 'maybe_compile', no_compiler)
    monkeypatch.setattr(captured_module, 'maybe_compile', no_compiler)
    _assert_equal(plain, run())
    fast = runner.fast_path.mode
    assert _counted(runner.fast_path) == {'compile': 1, 'depth_head': 1}
    assert fast.aggregator == 'whole_frame' and not fast.compiled
    assert not fast.head_on('depth head') and fast.head_on('camera head')
    assert runner.graphs is not None and not runner.head_step_built('depth head')


def test_a_backend_without_a_capturable_form_runs_segments(monkeypatch):
    monkeypatch.setattr(SdpaBackend, 'staged_attention', lambda self, *args: None)
    plain, runner, run = _plain_and_fast('whole_frame')
    _assert_equal(plain, run())
    fast = runner.fast_path.mode
    assert _counted(runner.fast_path) == {'backend_refused': 1}
    assert fast.aggregator == 'segments' and 'no staged attention' in fast.reason


def test_a_whole_frame_capture_that_fails_falls_back_to_segments(monkeypatch):
    # The refused frame must still come out right (run eagerly on the already staged cache),
    # and every later frame go segment by segment, through segments built once.
    import lingbot_map_ros.engine.model.frame_runner as frame_runner_module
    import lingbot_map_ros.engine.model.graphed as graphed_module
    from lingbot_map_ros.engine.model.graphed import FrameGraphs

    calls = []

    def capture(fn, pool=None):
        calls.append(fn)
        if len(calls) == 1:
            raise REFUSED
        outputs = fn()

        class Replay:
            def replay(self):
                for static, fresh in zip(outputs, fn()):
                    static.copy_(fresh)
        return Replay(), outputs

    class CapturingGraphs(FrameGraphs):
        """Capture on the CPU, through the stand-in."""

        def __init__(self, agg, image, kv_dtype, _capture, *args):
            super().__init__(agg, image, kv_dtype, True, *args)

    monkeypatch.setattr(graphed_module, 'capture_graph', capture)
    monkeypatch.setattr(torch.cuda, 'graph_pool_handle', lambda: None)
    monkeypatch.setattr(frame_runner_module, 'FrameGraphs', CapturingGraphs)
    plain, runner, run = _plain_and_fast('whole_frame', frames=9)
    fast = run()
    for a, b in zip(plain[1:], fast[1:]):
        for tap_a, tap_b in zip(a['taps'], b['taps']):
            torch.testing.assert_close(tap_b, tap_a, atol=1e-5, rtol=0)
    _assert_equal(plain, fast)
    depth = ModelConfig.from_preset('tiny').depth  # tiny_model's
    assert len(calls) == 1 + depth + 1  # the refused whole frame, then each segment once
    assert _counted(runner.fast_path) == {'whole_frame': 1}
    assert runner.fast_path.mode.aggregator == 'segments'


def test_a_failed_batch_capture_is_counted_and_the_batch_runs_eagerly():
    from lingbot_map_ros.engine.model.batched import BatchGraphs
    state = FastPathState('whole_frame', compile=False)
    graphs = BatchGraphs(True, lambda exc: state.fall_back('batch_capture', exc))
    x = torch.arange(6.0).reshape(2, 3)
    # No CUDA here: the capture fails, the segment runs eagerly, the step-down is counted.
    (out,) = graphs.run(('b2',), 0, lambda t: (t * 2.0,), x)
    torch.testing.assert_close(out, x * 2.0)
    assert not graphs.capture and graphs.captured == 0
    assert state.fallbacks()['batch_capture'] == 1
    assert state.mode.requested == 'whole_frame' and 'batched frames' in state.mode.reason
