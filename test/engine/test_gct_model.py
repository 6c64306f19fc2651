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
"""Streaming model behaviour on the 'tiny' preset: schedule, errors, precision paths.

Run: ``python -m pytest test/engine/test_gct_model.py`` from the repository root (CPU, seconds).
Numerical parity with the upstream model is in ``test_golden_parity.py`` (slow).
"""

from lingbot_map_ros.config import CacheConfig, ModelConfig
from lingbot_map_ros.engine.cache import new_kv_pool, StreamKV
from lingbot_map_ros.engine.errors import (CacheStateError, InvalidFrameError,
                                           ResolutionChangedError, TimeIndexLimitError)
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.stream_state import StreamState
from lingbot_map_ros.engine.model.weights import load_weights
from lingbot_map_ros.engine.stats import CacheStats
import pytest
from tiny_engine import random_images
import torch

CACHE = CacheConfig(backend='sdpa', scale_frames=2, sliding_window=2)


def _state(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in LingbotMapModel(config).state_dict().items():
        if name.endswith('gamma'):
            state[name] = torch.full(t.shape, 0.1)
        elif 'norm' in name and name.endswith('weight'):
            state[name] = 1 + 0.1 * torch.randn(t.shape, generator=g)
        else:
            state[name] = 0.05 * torch.randn(t.shape, generator=g)
    return state


def _model(seed: int = 0, **overrides) -> LingbotMapModel:
    config = ModelConfig.from_preset('tiny', **overrides)
    model = LingbotMapModel(config).eval()
    load_weights(model, _state(config, seed))
    return model


# The model keeps no stream state: each test model's stream is kept here (the engine keeps
# them in the node).
_STREAMS: dict[int, StreamState] = {}


def _start(model: LingbotMapModel, kv_dtype: torch.dtype = torch.float32,
           image_hw: tuple[int, int] = (56, 84)) -> None:
    pool = new_kv_pool(model.config, CACHE, kv_dtype, image_hw, 'cpu')
    kv = StreamKV(pool, CACHE.scale_frames, CACHE.sliding_window, CACHE.max_total_frames)
    _STREAMS[id(model)] = StreamState(model.new_camera_cache(), kv)


def _stream_of(model: LingbotMapModel) -> StreamState:
    if id(model) not in _STREAMS:  # a stream with no pages yet
        _STREAMS[id(model)] = StreamState(model.new_camera_cache())
    return _STREAMS[id(model)]


def _reset(model: LingbotMapModel) -> None:
    stream = _stream_of(model)
    stream.kv.reset()
    stream.camera.reset(keep_memory=True)


def _scale(model: LingbotMapModel, images: torch.Tensor, *args, **kwargs) -> dict:
    return model.forward_scale(images, _stream_of(model), *args, **kwargs)


def _frame(model: LingbotMapModel, image: torch.Tensor, time_index: int, keyframe: bool,
           *args, **kwargs) -> dict:
    return model.forward_frame(image, time_index, keyframe, _stream_of(model), *args, **kwargs)


def _cache_stats(model: LingbotMapModel) -> CacheStats:
    stream = _stream_of(model)
    camera = stream.camera.stats()
    return CacheStats.from_manager(stream.kv.stats(), camera.num_frames, camera.allocated_bytes)


@pytest.fixture(scope='module')
def images() -> torch.Tensor:
    return random_images(8, seed=1)


def _run(model, images, keyframes, kv_dtype=torch.float32, with_depth=False):
    _start(model, kv_dtype)
    outs = [_scale(model, images[:2].to(kv_dtype), with_depth=with_depth, return_taps=True)]
    t = 2
    for i, key in enumerate(keyframes):
        outs.append(_frame(model, images[2 + i:3 + i].to(kv_dtype), t, key,
                           with_depth=with_depth, return_taps=True))
        t += key
    return outs


def test_outputs_shapes_and_cache_counts(images):
    model = _model()
    outs = _run(model, images, [True, False, True], with_depth=True)
    assert outs[0]['pose_enc'].shape == (2, 9)
    assert outs[0]['pose_enc_iters'].shape == (2, 4, 9)
    assert outs[1]['depth'].shape == outs[1]['depth_conf'].shape == (1, 56, 84)
    assert [t.shape for t in outs[1]['taps']] == [(1, 30, 256)] * 4
    torch.testing.assert_close(outs[3]['pose_enc_iters'][:, -1], outs[3]['pose_enc'])
    stats = _cache_stats(model)
    assert stats.frame_count == 4 and stats.camera_frames == 4
    assert _stream_of(model).kv.remaining_frames() == CACHE.max_total_frames - 4


def test_non_keyframe_leaves_no_trace(images):
    model = _model()
    with_skip = _run(model, images, [True, False, True])
    # same frames minus the non-keyframe: the last keyframe must not notice the difference
    _start(model)
    _scale(model, images[:2])
    _frame(model, images[2:3], 2, True)
    last = _frame(model, images[4:5], 3, True, return_taps=True)
    torch.testing.assert_close(last['pose_enc'], with_skip[-1]['pose_enc'], rtol=0, atol=1e-6)
    torch.testing.assert_close(last['taps'][-1], with_skip[-1]['taps'][-1], rtol=0, atol=1e-6)


def test_special_token_variants():
    model = _model()
    agg = model.aggregator
    scale = agg.special_tokens(3, 'scale', torch.float32)
    stream = agg.special_tokens(1, 'keyframe', torch.float32)
    camera, register, scale_token = agg.camera_token[0], agg.register_token[0], agg.scale_token[0]
    assert torch.equal(scale[0, 0], camera[0, 0]) and torch.equal(scale[1, 0], camera[1, 0])
    assert torch.equal(scale[0, 1:5], register[0]) and torch.equal(scale[2, 1:5], register[1])
    assert all(torch.equal(scale[f, 5], scale_token[0, 0]) for f in range(3))
    assert torch.equal(stream[0], torch.cat([camera[1], register[1], scale_token[1]]))


def test_time_index_limit_is_checked_before_the_cache(images):
    model = _model(max_frame_num=4)
    _run(model, images, [True, True])  # time indices 0..3 fill the table
    before = _cache_stats(model)
    with pytest.raises(TimeIndexLimitError, match='max_frame_num=4'):
        _frame(model, images[4:5], 4, False)
    assert _cache_stats(model) == before
    _reset(model)
    _scale(model, images[:2])  # a reset session starts again at time 0


def test_call_order_and_frame_errors(images):
    model = _model()
    with pytest.raises(CacheStateError, match='no KV cache'):
        _scale(model, images[:2])
    _start(model)
    with pytest.raises(CacheStateError):
        _frame(model, images[:1], 0, True)
    _scale(model, images[:2])
    with pytest.raises(CacheStateError):
        _scale(model, images[:2])
    with pytest.raises(InvalidFrameError):
        _frame(model, images[:1, :, :50], 2, True)
    with pytest.raises(ResolutionChangedError):
        _frame(model, images[:1, :, :, :56], 2, True)
    with pytest.raises(ValueError):
        _frame(model, images[:2], 2, True)
    _start(model, image_hw=(56, 56))  # a new size needs a new cache
    out = _scale(model, images[:2, :, :, :56], with_depth=True)
    assert out['depth'].shape == (2, 56, 56)


def test_bf16_aggregator_path_runs_on_cpu(images):
    model = _model()
    ref = _run(model, images, [True, False])
    model.cast_aggregator(torch.bfloat16)
    assert model.compute_dtype == torch.bfloat16
    assert model.camera_head.embed_pose.weight.dtype == torch.float32
    out = _run(model, images, [True, False], kv_dtype=torch.bfloat16)
    assert _cache_stats(model).dtype == 'bfloat16'
    for got, want in zip(out, ref):
        assert got['taps'][0].dtype == torch.float32  # float32 residual stream
        assert got['pose_enc'].dtype == torch.float32  # heads in float32
        err = (got['pose_enc'] - want['pose_enc']).abs().max().item()
        assert 0 < err < 0.05 * want['pose_enc'].abs().max().item()


def test_float64_model_agrees_with_float32(images):
    model = _model()
    ref = _run(model, images, [True, False])
    model.double()
    out = _run(model, images, [True, False], kv_dtype=torch.float64)
    for got, want in zip(out, ref):
        assert got['pose_enc'].dtype == torch.float64
        torch.testing.assert_close(got['pose_enc'].float(), want['pose_enc'], rtol=0, atol=2e-5)


def test_new_weights_refresh_the_position_table(images):
    model = _model(seed=0)
    _start(model)
    _scale(model, images[:2])  # builds the resampled table for seed-0 weights
    load_weights(model, _state(model.config, seed=5))
    _reset(model)
    got = _scale(model, images[:2], return_taps=True)['dino_tokens']
    fresh = _model(seed=5)
    _start(fresh)
    want = _scale(fresh, images[:2], return_taps=True)['dino_tokens']
    torch.testing.assert_close(got, want, rtol=0, atol=0)
