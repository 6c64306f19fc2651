"""The segmented (CUDA-graph) streaming path gives the same outputs as the plain forward.

On the CPU the segments run eagerly (same modules, same order), which checks the segmentation:
taps, DINO tokens, poses and depth must equal the plain path's. On CUDA (marker gpu) the
segments are captured as CUDA graphs and replayed.

Run: ``python -m pytest test/engine/test_frame_graphs.py`` (a few seconds on 2 cores).
"""

from __future__ import annotations

import pytest
import torch

from lingbot_map_ros.config import CacheConfig, ModelConfig
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.golden_weights import golden_state_dict
from lingbot_map_ros.engine.model.weights import load_weights


def _model(device: str, dtype: torch.dtype) -> LingbotMapModel:
    model = LingbotMapModel(ModelConfig.from_preset('tiny'))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    load_weights(model, golden_state_dict(shapes, salt=3))
    model = model.to(device).eval()
    if dtype != torch.float32:
        model.cast_aggregator(dtype)
    return model


def _stream(model: LingbotMapModel, images: torch.Tensor, graphs: bool,
            kv_dtype: torch.dtype) -> list[dict]:
    model.aggregator.cuda_graphs = graphs
    model.start_stream(CacheConfig(backend='sdpa', scale_frames=2, sliding_window=3),
                       kv_dtype)
    outs = [model.forward_scale(images[:2], with_depth=True)]
    for i in range(2, images.shape[0]):
        # K=2 after N_s=2: even frames are keyframes; the time index counts cached keyframes,
        # so a non-keyframe shares the next keyframe's index.
        outs.append(model.forward_frame(images[i:i + 1], time_index=2 + (i - 1) // 2,
                                        keyframe=i % 2 == 0, with_depth=True, return_taps=True))
    return outs


def _compare(device: str, dtype: torch.dtype, atol: float) -> None:
    torch.manual_seed(0)
    images = torch.rand(9, 3, 56, 84, device=device)
    model = _model(device, dtype)
    plain = _stream(model, images, graphs=False, kv_dtype=dtype)
    graphed = _stream(model, images, graphs=True, kv_dtype=dtype)
    assert model.aggregator._frame_graphs is not None
    for a, b in zip(plain[1:], graphed[1:]):
        for key in ('pose_enc', 'pose_enc_iters', 'depth', 'depth_conf', 'dino_tokens'):
            torch.testing.assert_close(b[key], a[key], atol=atol, rtol=0)
        for tap_a, tap_b in zip(a['taps'], b['taps']):
            torch.testing.assert_close(tap_b, tap_a, atol=atol, rtol=0)
    # The frames differ, so equal outputs are not a constant: the poses must move.
    poses = torch.cat([o['pose_enc'] for o in graphed[1:]])
    assert (poses[1:] - poses[:-1]).abs().max() > 1e-4


def test_eager_segments_equal_the_plain_forward_on_cpu():
    _compare('cpu', torch.float32, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_graphs_equal_the_plain_forward_in_bf16():
    _compare('cuda', torch.bfloat16, atol=1e-3)


def test_a_runner_that_cannot_be_built_falls_back_to_the_plain_forward(monkeypatch):
    import lingbot_map_ros.engine.model.aggregator as aggregator_module

    def refuse(*_args, **_kwargs):
        raise RuntimeError('operation not permitted when stream is capturing')

    torch.manual_seed(0)
    images = torch.rand(5, 3, 56, 84)
    model = _model('cpu', torch.float32)
    plain = _stream(model, images, graphs=False, kv_dtype=torch.float32)
    monkeypatch.setattr(aggregator_module, 'FrameGraphs', refuse)
    fallback = _stream(model, images, graphs=True, kv_dtype=torch.float32)
    assert model.aggregator.cuda_graphs is False
    for a, b in zip(plain, fallback):
        torch.testing.assert_close(b['pose_enc'], a['pose_enc'], atol=0, rtol=0)
