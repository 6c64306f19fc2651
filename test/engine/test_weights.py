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
"""Checkpoint loading and conversion with small 'tiny'-preset checkpoints written to tmp_path.

Run: ``python -m pytest test/engine/test_weights.py`` from the repository root (CPU, seconds).
"""

import argparse
import logging

from lingbot_map_ros.config import ModelConfig
from lingbot_map_ros.engine.errors import WeightsError
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.weights import load_checkpoint, load_weights
from lingbot_map_ros.tools.convert import convert, main as convert_main
import pytest
from safetensors.torch import save_file
import torch


def _tiny() -> LingbotMapModel:
    return LingbotMapModel(ModelConfig.from_preset('tiny'))


@pytest.fixture(scope='module')
def source_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {k: torch.randn(v.shape, generator=g) for k, v in _tiny().state_dict().items()}


def _assert_loaded(model: LingbotMapModel, state: dict[str, torch.Tensor]) -> None:
    loaded = model.state_dict()
    assert loaded.keys() == state.keys()
    for name, value in state.items():
        assert torch.equal(loaded[name], value), name


@pytest.mark.parametrize('suffix,wrap', [('.pt', False), ('.pth', True),
                                         ('.safetensors', False)])
def test_round_trip(tmp_path, source_state, suffix, wrap):
    path = tmp_path / f'ckpt{suffix}'
    if suffix == '.safetensors':
        save_file(source_state, str(path))
    else:
        torch.save({'model': source_state} if wrap else source_state, path)
    model = _tiny()
    load_weights(model, load_checkpoint(path))
    _assert_loaded(model, source_state)


def test_missing_unexpected_and_misshaped_are_all_reported(source_state):
    state = dict(source_state)
    del state['camera_head.trunk_norm.weight'], state['aggregator.camera_token']
    state['aggregator.extra.weight'] = torch.zeros(3)
    state['depth_head.norm.weight'] = torch.zeros(7)
    model = _tiny()
    before = model.state_dict()['aggregator.scale_token'].clone()
    with pytest.raises(WeightsError) as info:
        load_weights(model, state)
    message = str(info.value)
    assert '2 missing' in message and 'camera_head.trunk_norm.weight' in message
    assert '1 unexpected' in message and 'aggregator.extra.weight' in message
    assert '1 mis-shaped' in message and 'depth_head.norm.weight [7] != [256]' in message
    # nothing was copied
    assert torch.equal(model.state_dict()['aggregator.scale_token'], before)


def test_point_head_is_dropped_with_warning(source_state, caplog):
    state = dict(source_state, **{'point_head.norm.weight': torch.ones(4)})
    model = _tiny()
    with caplog.at_level(logging.WARNING):
        load_weights(model, state)
    assert 'point_head' in caplog.text
    _assert_loaded(model, source_state)


def test_pickled_objects_need_explicit_opt_in(tmp_path, source_state):
    path = tmp_path / 'training.pt'
    torch.save({'model': source_state, 'args': argparse.Namespace(lr=1e-4)}, path)
    with pytest.raises(WeightsError, match='weights_only=True'):
        load_checkpoint(path)
    model = _tiny()
    load_weights(model, load_checkpoint(path, allow_pickle=True))
    _assert_loaded(model, source_state)


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / 'absent.pt')
    (tmp_path / 'w.npz').write_bytes(b'x')
    with pytest.raises(WeightsError, match='suffix'):
        load_checkpoint(tmp_path / 'w.npz')
    torch.save([torch.zeros(1)], tmp_path / 'list.pt')
    with pytest.raises(WeightsError, match='expected a state dict'):
        load_checkpoint(tmp_path / 'list.pt')


def test_weights_follow_parameter_dtype(source_state):
    model = _tiny().cast_aggregator(torch.bfloat16)
    load_weights(model, source_state)
    token = model.aggregator.camera_token
    assert token.dtype == torch.bfloat16
    assert torch.equal(token, source_state['aggregator.camera_token'].bfloat16())
    assert model.camera_head.embed_pose.weight.dtype == torch.float32


def test_convert_checks_and_round_trips(tmp_path, source_state):
    src, dst = tmp_path / 'in.pt', tmp_path / 'out.safetensors'
    torch.save({'model': dict(source_state, **{'point_head.x': torch.ones(2)})}, src)
    assert convert(src, dst, preset='tiny') == len(source_state)
    model = _tiny()
    load_weights(model, load_checkpoint(dst))
    _assert_loaded(model, source_state)
    # against the official model the tiny checkpoint is rejected (exit status 1, no output)
    bad = tmp_path / 'bad.safetensors'
    assert convert_main([str(src), str(bad)]) == 1
    assert not bad.exists()
    assert convert_main([str(src), str(bad), '--no-check']) == 0
    assert len(load_checkpoint(bad)) == len(source_state)
