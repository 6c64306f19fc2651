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
"""A streaming frame is a batch of one: through the runner's fast paths it equals eager.

On the CPU the segments and whole batches run eagerly (same modules, same order), which checks
the segmentation and the staging: taps, DINO tokens, poses and depth must equal the eager
forward's. On CUDA (marker gpu) they are captured as CUDA graphs and replayed, whole-batch
graphs keyed per kind of frame (window filling; a full window's keyframe and non-keyframe).

Run: ``python -m pytest test/engine/test_frame_graphs.py`` (a few seconds on 2 cores).
"""

from __future__ import annotations

from lingbot_map_ros.engine.runner.fast_path import FastPathState
from lingbot_map_ros.engine.runner.jobs import Job
from lingbot_map_ros.engine.runner.runner import Runner
import pytest
# tiny_engine and tiny_stream sit next to this file (pytest puts test/engine on sys.path).
from tiny_engine import random_images
from tiny_stream import CACHE, new_stream, run_stream, stand_in_capture, tiny_model
import torch

FRAMES = 9
"""N_s 2, W 3, K 2: the window is full from frame 6 on, so frames 7 and 8 take the full-window
(cuDNN split) graphs on CUDA and the earlier ones the window-fill graph."""


def _assert_outputs_close(plain: list[dict], fast: list[dict], atol: float,
                          rtol: float) -> None:
    assert len(plain) == len(fast)
    for a, b in zip(plain[1:], fast[1:]):
        for key in ('pose_enc', 'pose_enc_iters', 'depth', 'depth_conf', 'dino_tokens'):
            torch.testing.assert_close(b[key], a[key], atol=atol, rtol=rtol)
        assert len(a['taps']) == len(b['taps'])
        for tap_a, tap_b in zip(a['taps'], b['taps']):
            torch.testing.assert_close(tap_b, tap_a, atol=atol, rtol=rtol)
    # The frames differ, so equal outputs are not a constant: the poses must move.
    poses = torch.cat([o['pose_enc'] for o in fast[1:]])
    assert (poses[1:] - poses[:-1]).abs().max() > 1e-4


def _compare(device: str, dtype: torch.dtype, atol: float, compile_frames: bool = False,
             rtol: float = 0.0, staged: bool = True) -> None:
    images = random_images(FRAMES, seed=0, device=device)
    model = tiny_model(device, dtype)
    plain = run_stream(model, images, None, dtype)
    mode = 'whole_frame' if staged else 'segments'
    runner = Runner(model, FastPathState(mode, compile_frames))
    fast_out = run_stream(model, images, runner, dtype)
    # Every part took its fast path (none fell back), whole batches when staged.
    fast = runner.fast_path.mode
    assert fast.requested == mode and fast.aggregator == mode
    assert sum(runner.fast_path.fallbacks().values()) == 0 and fast.reason == ''
    assert fast.segments_compile is compile_frames
    whole, streaming = runner.batches.whole, FRAMES - CACHE.scale_frames
    cuda = device == 'cuda'
    if staged:
        # Every streaming frame ran whole, as a batch of one; no segment graph was captured.
        assert whole is not None and whole.batches == streaming
        assert runner.batches.captured == 0
        if cuda:
            # One graph per kind of frame: window filling, a full window's keyframe and its
            # non-keyframe (the patch run sits in one of two places).
            assert len(whole.keys) == 3, whole.keys
            assert all(key.shape[0] == 1 for key in whole.keys)
            staged_keys = [key.staged[0] for key in whole.keys]
            assert staged_keys.count(('range',)) == 1
            assert sum(key[0] == 'split' for key in staged_keys) == 2
        else:
            assert whole.captured == 0  # nothing is captured on the CPU
    else:
        assert whole is None
        # One key (batch of one at this size) for keyframes and non-keyframes alike.
        assert runner.batches.captured == (model.config.depth + 1 if cuda else 0)
    assert runner.heads.head_step_built('camera head')
    assert runner.heads.head_step_built('depth head')
    assert fast.head_on('camera head') and fast.head_on('depth head')
    _assert_outputs_close(plain, fast_out, atol, rtol)


@pytest.mark.parametrize('staged', [True, False], ids=['whole-frames', 'segments'])
def test_eager_segments_equal_the_plain_forward_on_cpu(staged):
    # 1e-5, not exact: the camera head's fixed-shape path sums its masked attention over the
    # whole buffer (fp32 rounding ~1e-6 on poses of ~1); a wrong segment is off by >1e-2.
    _compare('cpu', torch.float32, atol=1e-5, staged=staged)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('staged', [True, False], ids=['whole-frames', 'segments'])
@pytest.mark.parametrize('compile_frames', [False, True], ids=['graphs', 'compiled-graphs'])
def test_cuda_graphs_equal_the_plain_forward_in_bf16(compile_frames, staged):
    # Graphs replay the same kernels: equal to bf16 noise. Compiled, Inductor keeps fused
    # intermediates in float32 where eager rounds each op to bf16: a few bf16 ulps apart.
    # Whole frames attend with flash varlen / cuDNN where eager uses SDPA's flash: likewise.
    if compile_frames or staged:
        _compare('cuda', torch.bfloat16, atol=2e-2, rtol=2e-2, compile_frames=compile_frames,
                 staged=staged)
    else:
        _compare('cuda', torch.bfloat16, atol=1e-3, staged=False)


def test_compiled_segments_equal_the_plain_forward_on_cpu():
    # Inductor on the CPU (C++ codegen): the same fused bodies the GPU gets as Triton kernels.
    # Fusion reorders float32 sums, hence a tolerance instead of equality.
    images = random_images(7, seed=0)
    model = tiny_model('cpu', torch.float32)
    plain = run_stream(model, images, None, torch.float32)
    runner = Runner(model, FastPathState('whole_frame', True))
    compiled = run_stream(model, images, runner, torch.float32)
    # Compiled, not fallen back; the depth head took its one-step path.
    fast = runner.fast_path.mode
    assert sum(runner.fast_path.fallbacks().values()) == 0, fast.reason
    assert fast.compiled is True and fast.head_on('depth head')
    assert runner.batches.bodies.compiled is True
    assert runner.heads.head_step_built('depth head')
    assert len(plain) == len(compiled)
    for a, b in zip(plain[1:], compiled[1:]):
        for key in ('pose_enc', 'depth', 'dino_tokens'):
            torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=1e-4)


def _prepared_stream(device: str, dtype: torch.dtype):
    """Return a runner with a batch of one's full-window graphs captured ahead, a reset stream."""
    images = random_images(FRAMES, seed=0, device=device)
    model = tiny_model(device, dtype)
    runner = Runner(model, FastPathState('whole_frame', False))
    state = new_stream(model, dtype, images)
    runner.prepare_full_window(Job(state, images[:1], CACHE.scale_frames, 'keyframe', True))
    prepared = runner.batches.whole.keys if runner.batches.whole is not None else ()
    state.kv.reset()  # the placeholders wrote into the stream's pages
    return images, model, runner, state, prepared


def test_full_window_graphs_captured_ahead_leave_a_live_stream_nothing_to_capture(monkeypatch):
    # On the CPU the sdpa form has one key for every frame, ('range',): prepared ahead, the
    # stream's every streaming frame replays it (through the stand-in) and captures nothing.
    calls = stand_in_capture(monkeypatch)
    images, model, runner, state, prepared = _prepared_stream('cpu', torch.float32)
    assert len(calls) == 1 and len(prepared) == 1 and prepared[0].staged == (('range',), False)
    fast = run_stream(model, images, runner, torch.float32, state=state)
    assert len(calls) == 1 and runner.batches.whole.keys == prepared
    assert runner.batches.whole.batches == FRAMES - CACHE.scale_frames
    assert sum(runner.fast_path.fallbacks().values()) == 0, runner.fast_path.mode.reason
    # The placeholders left nothing behind: the frames equal a stream that never saw them.
    _assert_outputs_close(run_stream(model, images, None, torch.float32), fast, 1e-5, 0.0)


def test_prepare_full_window_captures_nothing_without_a_capture_on_the_cpu():
    images, model, runner, state, prepared = _prepared_stream('cpu', torch.float32)
    assert prepared == () and runner.fast_path.mode.aggregator == 'whole_frame'
    assert state.kv.num_frames == 0
    fast = run_stream(model, images, runner, torch.float32, state=state)
    _assert_outputs_close(run_stream(model, images, None, torch.float32), fast, 1e-5, 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_full_window_graphs_captured_ahead_serve_the_live_full_window_frames():
    # Captured ahead: the full window's keyframe and non-keyframe graphs (cuDNN split); a live
    # stream then captures only its window-fill graph, never one for a full-window frame.
    images, model, runner, state, prepared = _prepared_stream('cuda', torch.bfloat16)
    assert sorted(key.staged[0][0] for key in prepared) == ['split', 'split']
    fast = run_stream(model, images, runner, torch.bfloat16, state=state)
    assert sum(runner.fast_path.fallbacks().values()) == 0, runner.fast_path.mode.reason
    whole = runner.batches.whole
    added = [key for key in whole.keys if key not in prepared]
    assert set(prepared) <= set(whole.keys)
    assert [key.staged[0] for key in added] == [('range',)], whole.keys
    plain = run_stream(model, images, None, torch.bfloat16)
    _assert_outputs_close(plain, fast, 2e-2, 2e-2)
