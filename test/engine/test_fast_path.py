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
"""The fast path's one mode value and its counted step-downs (``engine/runner/fast_path.py``).

Each step-down that can happen on the CPU is made to happen here (a stand-in for the refusing
compiler, capture or backend), and each test checks three things: the kind's counter, the mode
that runs afterwards, and outputs equal to the eager forward's (the step-down is slower, never
wrong). Only ``whole_frame`` needs a capture: a stand-in "capture" runs the function and
replays it by calling it again, which is what a graph replay does. A refused segment capture
('capture') needs CUDA (marker gpu): on the CPU segments are never captured.

Run: ``python -m pytest test/engine/test_fast_path.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import logging

from lingbot_map_ros.engine.attention.sdpa import ReferenceBackend, SdpaBackend
import lingbot_map_ros.engine.runner.batch_runs as batch_runs_module
import lingbot_map_ros.engine.runner.captured as captured_module
from lingbot_map_ros.engine.runner.fast_path import FastPathState
from lingbot_map_ros.engine.runner.runner import Runner
import lingbot_map_ros.engine.runner.segments as segments_module
from lingbot_map_ros.engine.stats import FALLBACK_KINDS
import numpy as np
import pytest
# tiny_engine and tiny_stream sit next to this file (pytest puts test/engine on sys.path).
from tiny_engine import random_images, tiny_session
from tiny_stream import CACHE, run_stream, stand_in_capture, tiny_model
import torch

REFUSED = RuntimeError('operation not permitted when stream is capturing')


def _counted(state: FastPathState) -> dict[str, int]:
    """Return the non-zero counters."""
    return {kind: n for kind, n in state.fallbacks().items() if n}


def _plain_and_fast(mode: str, compile_: bool = False, frames: int = 5, device: str = 'cpu',
                    dtype: torch.dtype = torch.float32):
    """Return the eager forward's outputs, a fresh runner asking for ``mode``, its run."""
    images = random_images(frames, seed=0, device=device)
    model = tiny_model(device, dtype)
    plain = run_stream(model, images, None, dtype)
    runner = Runner(model, FastPathState(mode, compile_))
    return plain, runner, lambda: run_stream(model, images, runner, dtype)


def _assert_equal(plain: list[dict], fast: list[dict], atol: float = 1e-5,
                  rtol: float = 0.0) -> None:
    assert len(plain) == len(fast)
    for a, b in zip(plain, fast):
        for key in ('pose_enc', 'depth'):
            torch.testing.assert_close(b[key], a[key], atol=atol, rtol=rtol)


def test_the_mode_is_one_value_that_each_step_down_lowers(caplog):
    state = FastPathState('whole_frame', True)
    assert state.mode.aggregator == 'segments'  # no pool bound yet: nothing to stage on
    state.bind(SdpaBackend(), True)
    before = state.mode
    assert (before.aggregator, before.compiled, before.reason) == ('whole_frame', True, '')
    assert before.head_on('camera head') and before.head_on('depth head')
    with caplog.at_level(logging.WARNING, logger='lingbot_map_ros.engine.runner.fast_path'):
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_a_refused_segment_capture_runs_the_frames_eagerly(monkeypatch):
    # A capture this PyTorch/driver refuses: the segment runs eagerly, the step-down is
    # counted once and every later frame (a batch of one) runs on the eager forward; the heads'
    # fast path is independent of the aggregator's.
    def refuse(*_args, **_kwargs):
        raise REFUSED

    plain, runner, run = _plain_and_fast('segments', device='cuda', dtype=torch.bfloat16)
    monkeypatch.setattr(batch_runs_module, 'CapturedCall', refuse)
    _assert_equal(plain, run(), atol=1e-3, rtol=1e-3)
    fast = runner.fast_path.mode
    assert fast.requested == 'segments' and fast.aggregator == 'eager'
    assert _counted(runner.fast_path) == {'capture': 1}
    assert 'eagerly' in fast.reason and 'capturing' in fast.reason
    assert runner.batches.captured == 0
    assert fast.head_on('camera head') and runner.heads.head_step_built('camera head')


def _no_compiler(fn, enabled):
    """``maybe_compile`` of a machine without a compiler: the first call fails (as Inductor's)."""
    if not enabled:
        return fn

    def compiled(*_args, **_kwargs):
        raise RuntimeError('Inductor: no C++ compiler')
    return compiled


@pytest.mark.parametrize('mode', ['whole_frame', 'segments'])
def test_a_failed_compilation_runs_uncompiled_and_a_failed_head_runs_eagerly(monkeypatch, mode):
    # A compiler that refuses everything: the segments run uncompiled (the mode stays), the
    # depth head (whose step is compiled) eagerly; the camera head's step is never compiled
    # and stays on.
    monkeypatch.setattr(segments_module, 'maybe_compile', _no_compiler)
    monkeypatch.setattr(captured_module, 'maybe_compile', _no_compiler)
    plain, runner, run = _plain_and_fast(mode, compile_=True)
    _assert_equal(plain, run())
    fast = runner.fast_path.mode
    assert _counted(runner.fast_path) == {'compile': 1, 'depth_head': 1}
    assert fast.aggregator == mode and not fast.compiled
    assert not runner.batches.bodies.compiled
    assert 'uncompiled' in fast.reason or 'eagerly' in fast.reason
    assert not fast.head_on('depth head') and fast.head_on('camera head')
    assert runner.heads.head_step_built('camera head')
    assert not runner.heads.head_step_built('depth head')
    whole = runner.batches.whole
    assert (whole.batches if whole is not None else 0) == \
        (3 if mode == 'whole_frame' else 0)  # 5 frames: 3 streaming ones, each whole


def test_a_backend_without_a_capturable_form_runs_segments(monkeypatch):
    monkeypatch.setattr(SdpaBackend, 'staged_attention', lambda self, *args: None)
    plain, runner, run = _plain_and_fast('whole_frame')
    _assert_equal(plain, run())
    fast = runner.fast_path.mode
    assert _counted(runner.fast_path) == {'backend_refused': 1}
    assert fast.aggregator == 'segments' and 'no staged attention' in fast.reason
    assert runner.batches.whole is None


def test_a_whole_frame_capture_that_fails_falls_back_to_segments(monkeypatch):
    # The refused frame must still come out right (run eagerly on the already staged cache),
    # and every later frame go segment by segment (eagerly here: the CPU captures no segment).
    calls = stand_in_capture(monkeypatch, refuse_first=REFUSED)
    plain, runner, run = _plain_and_fast('whole_frame', frames=9)
    fast = run()
    for a, b in zip(plain[1:], fast[1:]):
        for tap_a, tap_b in zip(a['taps'], b['taps']):
            torch.testing.assert_close(tap_b, tap_a, atol=1e-5, rtol=0)
    _assert_equal(plain, fast)
    assert len(calls) == 1  # the refused whole batch; nothing captured after it
    assert _counted(runner.fast_path) == {'whole_frame': 1}
    assert runner.fast_path.mode.aggregator == 'segments'
    assert 'segment by segment' in runner.fast_path.mode.reason
    # Only the refused frame ran whole; the 6 after it went through the segments.
    assert runner.batches.whole.batches == 1 and runner.batches.whole.captured == 0
    assert len(fast) == 9 - CACHE.scale_frames + 1
