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
"""The segmented (CUDA-graph) streaming path gives the same outputs as the plain forward.

On the CPU the segments run eagerly (same modules, same order), which checks the segmentation:
taps, DINO tokens, poses and depth must equal the plain path's. On CUDA (marker gpu) the
segments are captured as CUDA graphs and replayed.

Run: ``python -m pytest test/engine/test_frame_graphs.py`` (a few seconds on 2 cores).
"""

from __future__ import annotations

from lingbot_map_ros.config import CacheConfig, ModelConfig
from lingbot_map_ros.engine.cache import new_kv_pool, StreamKV
from lingbot_map_ros.engine.model.frame_runner import FrameRunner
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.golden_weights import golden_state_dict
from lingbot_map_ros.engine.model.stream_state import StreamState
from lingbot_map_ros.engine.model.weights import load_weights
import pytest
import torch

_CACHE = CacheConfig(backend='sdpa', scale_frames=2, sliding_window=3)


def _model(device: str, dtype: torch.dtype) -> LingbotMapModel:
    model = LingbotMapModel(ModelConfig.from_preset('tiny'))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    load_weights(model, golden_state_dict(shapes, salt=3))
    model = model.to(device).eval()
    if dtype != torch.float32:
        model.cast_aggregator(dtype)
    return model


# One fast path per model, kept across streams (as the engine keeps it).
_RUNNERS: dict[int, FrameRunner] = {}


def _runner(model: LingbotMapModel) -> FrameRunner:
    return _RUNNERS.setdefault(id(model), FrameRunner.for_model(model))


def _new_stream(model: LingbotMapModel, kv_dtype: torch.dtype,
                images: torch.Tensor) -> StreamState:
    pool = new_kv_pool(model.config, _CACHE, kv_dtype, images.shape[-2:], images.device)
    kv = StreamKV(pool, _CACHE.scale_frames, _CACHE.sliding_window, _CACHE.max_total_frames)
    return StreamState(model.new_camera_cache(), kv)


def _stream(model: LingbotMapModel, images: torch.Tensor, graphs: bool,
            kv_dtype: torch.dtype, compile_frames: bool = False,
            staged: bool = True) -> list[dict]:
    # A fast path asks for whole frames or segments; 'eager' is the plain forward.
    mode = ('whole_frame' if staged else 'segments') if graphs or compile_frames else 'eager'
    runner = _runner(model)
    runner.set_fast_path(mode, compile_frames)
    state = _new_stream(model, kv_dtype, images)
    outs = [model.forward_scale(images[:2], state, with_depth=True, runner=runner)]
    for i in range(2, images.shape[0]):
        # K=2 after N_s=2: even frames are keyframes; the time index counts cached keyframes,
        # so a non-keyframe shares the next keyframe's index.
        outs.append(model.forward_frame(images[i:i + 1], 2 + (i - 1) // 2, i % 2 == 0, state,
                                        with_depth=True, return_taps=True, runner=runner))
    return outs


def _compare(device: str, dtype: torch.dtype, atol: float, compile_frames: bool = False,
             rtol: float = 0.0, staged: bool = True) -> None:
    torch.manual_seed(0)
    # N_s 2, W 3, K 2: the window is full from frame 6 on, so frames 7 and 8 take the
    # full-window (cuDNN split) graphs on CUDA and the earlier ones the window-fill graph.
    images = torch.rand(9, 3, 56, 84, device=device)
    model = _model(device, dtype)
    plain = _stream(model, images, graphs=False, kv_dtype=dtype)
    graphed = _stream(model, images, graphs=True, kv_dtype=dtype, compile_frames=compile_frames,
                      staged=staged)
    # Every part took its fast path (none fell back), whole frames when staged.
    runner = _runner(model).graphs
    assert runner is not None and _runner(model).requested != 'eager'
    assert runner.staged is staged and _runner(model).stats().fallbacks == 0
    assert _runner(model).mode == ('whole_frame' if staged else 'segments')
    if staged and device == 'cuda':
        assert ('range',) in runner._whole
        assert any(key[0] == 'split' for key in runner._whole)
    assert _runner(model).compile is compile_frames
    assert _runner(model).head_step_built('camera head')
    assert _runner(model).head_step_built('depth head')
    assert _runner(model).head_fast_path('camera head')
    assert _runner(model).head_fast_path('depth head')
    for a, b in zip(plain[1:], graphed[1:]):
        for key in ('pose_enc', 'pose_enc_iters', 'depth', 'depth_conf', 'dino_tokens'):
            torch.testing.assert_close(b[key], a[key], atol=atol, rtol=rtol)
        for tap_a, tap_b in zip(a['taps'], b['taps']):
            torch.testing.assert_close(tap_b, tap_a, atol=atol, rtol=rtol)
    # The frames differ, so equal outputs are not a constant: the poses must move.
    poses = torch.cat([o['pose_enc'] for o in graphed[1:]])
    assert (poses[1:] - poses[:-1]).abs().max() > 1e-4


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


def test_a_runner_that_cannot_be_built_falls_back_to_the_plain_forward(monkeypatch):
    import lingbot_map_ros.engine.model.frame_runner as frame_runner_module

    def refuse(*_args, **_kwargs):
        raise RuntimeError('operation not permitted when stream is capturing')

    torch.manual_seed(0)
    images = torch.rand(5, 3, 56, 84)
    model = _model('cpu', torch.float32)
    plain = _stream(model, images, graphs=False, kv_dtype=torch.float32)
    monkeypatch.setattr(frame_runner_module, 'FrameGraphs', refuse)
    fallback = _stream(model, images, graphs=True, kv_dtype=torch.float32)
    assert _runner(model).requested == 'whole_frame'
    assert _runner(model).mode == 'eager' and _runner(model).stats().fallbacks == 1
    # The heads' fast path is independent of the aggregator's.
    assert _runner(model).head_fast_path('camera head')
    assert _runner(model).head_step_built('camera head')
    for a, b in zip(plain, fallback):
        torch.testing.assert_close(b['pose_enc'], a['pose_enc'], atol=1e-5, rtol=0)


def test_compiled_segments_equal_the_plain_forward_on_cpu():
    # Inductor on the CPU (C++ codegen): the same fused bodies the GPU gets as Triton kernels.
    # Fusion reorders float32 sums, hence a tolerance instead of equality.
    torch.manual_seed(0)
    images = torch.rand(7, 3, 56, 84)
    model = _model('cpu', torch.float32)
    plain = _stream(model, images, graphs=False, kv_dtype=torch.float32)
    compiled = _stream(model, images, graphs=False, kv_dtype=torch.float32, compile_frames=True)
    # Compiled, not fallen back; the depth head took its single-frame path.
    assert _runner(model).compile is True
    assert _runner(model).head_fast_path('depth head')
    assert _runner(model).head_step_built('depth head')
    for a, b in zip(plain[1:], compiled[1:]):
        for key in ('pose_enc', 'depth', 'dino_tokens'):
            torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=1e-4)


def test_a_whole_frame_capture_that_fails_falls_back_to_segments(monkeypatch):
    # The capture path needs CUDA; here a stand-in "capture" refuses the first (whole-frame)
    # graph and replays later ones by calling the function again and refilling its outputs,
    # which is what a graph replay does. The refused frame must still come out right (run
    # eagerly on the already staged cache), and every later frame go segment by segment.
    import lingbot_map_ros.engine.model.graphed as graphed_module
    from lingbot_map_ros.engine.cache.staged_frames import StagedFrames
    from lingbot_map_ros.engine.model.graphed import FrameGraphs

    calls = []

    def capture(fn, pool=None):
        calls.append(fn)
        if len(calls) == 1:
            raise RuntimeError('operation not permitted when stream is capturing')
        outputs = fn()

        class Replay:
            def replay(self):
                for static, fresh in zip(outputs, fn()):
                    static.copy_(fresh)
        return Replay(), outputs

    monkeypatch.setattr(graphed_module, 'capture_graph', capture)
    monkeypatch.setattr(torch.cuda, 'graph_pool_handle', lambda: None)
    torch.manual_seed(0)
    images = torch.rand(9, 3, 56, 84)
    model = _model('cpu', torch.float32)
    plain = _stream(model, images, graphs=False, kv_dtype=torch.float32)
    state = _new_stream(model, torch.float32, images)
    model.forward_scale(images[:2], state)
    agg, kv = model.aggregator, state.kv
    fallbacks = []
    with torch.no_grad():  # as the model's forward runs it
        runner = FrameGraphs(agg, images[2:3], torch.float32, capture=True,
                             staging=StagedFrames(kv.pool),
                             fall_back=lambda what, exc: fallbacks.append(what))
        for i in range(2, images.shape[0]):
            keyframe = i % 2 == 0
            out = runner.run(images[i:i + 1], 2 + (i - 1) // 2,
                             'keyframe' if keyframe else 'non-keyframe', kv)
            if i == 2:
                assert not runner.staged and len(calls) == 1 + agg.config.depth + 1
            for tap, want in zip(out.taps, plain[i - 1]['taps']):
                torch.testing.assert_close(tap, want, atol=1e-5, rtol=0)
    assert kv.stats()['frame_count'] == 2 + 4  # keyframes 2, 4, 6, 8
    assert fallbacks == ['whole-frame CUDA graph unavailable; running frames segment by segment']
