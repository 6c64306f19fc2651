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

from lingbot_map_ros.engine.model.frame_runner import FrameRunner
from lingbot_map_ros.engine.model.gct import LingbotMapModel
import pytest
# tiny_engine and tiny_stream sit next to this file (pytest puts test/engine on sys.path).
from tiny_engine import random_images
from tiny_stream import run_stream, tiny_model
import torch

# One fast path per model, kept across streams (as the engine keeps it).
_RUNNERS: dict[int, FrameRunner] = {}


def _runner(model: LingbotMapModel) -> FrameRunner:
    return _RUNNERS.setdefault(id(model), FrameRunner.for_model(model))


def _stream(model: LingbotMapModel, images: torch.Tensor, graphs: bool,
            kv_dtype: torch.dtype, compile_frames: bool = False,
            staged: bool = True) -> list[dict]:
    # A fast path asks for whole frames or segments; 'eager' is the plain forward.
    mode = ('whole_frame' if staged else 'segments') if graphs or compile_frames else 'eager'
    runner = _runner(model)
    runner.fast_path.request(mode, compile_frames)
    return run_stream(model, images, runner, kv_dtype)


def _compare(device: str, dtype: torch.dtype, atol: float, compile_frames: bool = False,
             rtol: float = 0.0, staged: bool = True) -> None:
    # N_s 2, W 3, K 2: the window is full from frame 6 on, so frames 7 and 8 take the
    # full-window (cuDNN split) graphs on CUDA and the earlier ones the window-fill graph.
    images = random_images(9, seed=0, device=device)
    model = tiny_model(device, dtype)
    plain = _stream(model, images, graphs=False, kv_dtype=dtype)
    graphed = _stream(model, images, graphs=True, kv_dtype=dtype, compile_frames=compile_frames,
                      staged=staged)
    # Every part took its fast path (none fell back), whole frames when staged.
    runner = _runner(model)
    graphs, fast = runner.graphs, runner.fast_path.mode
    assert graphs is not None and fast.requested != 'eager'
    assert fast.aggregator == ('whole_frame' if staged else 'segments')
    assert sum(runner.fast_path.fallbacks().values()) == 0 and fast.reason == ''
    if staged and device == 'cuda':
        assert ('range',) in graphs.whole_keys
        assert any(key[0] == 'split' for key in graphs.whole_keys)
    assert fast.segments_compile is compile_frames
    assert runner.head_step_built('camera head')
    assert runner.head_step_built('depth head')
    assert fast.head_on('camera head') and fast.head_on('depth head')
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


def test_compiled_segments_equal_the_plain_forward_on_cpu():
    # Inductor on the CPU (C++ codegen): the same fused bodies the GPU gets as Triton kernels.
    # Fusion reorders float32 sums, hence a tolerance instead of equality.
    images = random_images(7, seed=0)
    model = tiny_model('cpu', torch.float32)
    plain = _stream(model, images, graphs=False, kv_dtype=torch.float32)
    compiled = _stream(model, images, graphs=False, kv_dtype=torch.float32, compile_frames=True)
    # Compiled, not fallen back; the depth head took its single-frame path.
    fast = _runner(model).fast_path.mode
    assert fast.compiled is True and fast.head_on('depth head')
    assert _runner(model).head_step_built('depth head')
    for a, b in zip(plain[1:], compiled[1:]):
        for key in ('pose_enc', 'depth', 'dino_tokens'):
            torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=1e-4)
