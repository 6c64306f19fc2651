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
"""The kernels' benchmark overrides (``fa3``, ``triton``) and FA3's unit-scale query cast (CPU)."""

from lingbot_map_ros.engine.attention.fa3 import FA3_CONFIG, fa3_config, unit_scale_queries
import pytest
import torch


def test_without_an_override_the_config_is_the_default(monkeypatch):
    monkeypatch.delenv('LINGBOT_MAP_FA3_CONFIG', raising=False)
    assert fa3_config() == FA3_CONFIG
    config = fa3_config()
    config['splits'] = 99  # a copy: the default stays
    assert FA3_CONFIG['splits'] != 99


def test_an_override_replaces_only_its_keys(monkeypatch):
    monkeypatch.setenv('LINGBOT_MAP_FA3_CONFIG', '{"splits": 3}')
    assert fa3_config() == {**FA3_CONFIG, 'splits': 3}
    monkeypatch.setenv('LINGBOT_MAP_FA3_CONFIG',
                       '{"query_scale": "head", "splits": 0, "parts": 1}')
    assert fa3_config() == {'splits': 0, 'query_scale': 'head', 'parts': 1,
                            'joint_parts': FA3_CONFIG['joint_parts'],
                            'joint_tail_rows': FA3_CONFIG['joint_tail_rows'],
                            'tail_splits': FA3_CONFIG['tail_splits']}


@pytest.mark.parametrize('raw', ['not json', '[1]', '{"split": 2}', '{"splits": -1}',
                                 '{"splits": 1.5}', '{"query_scale": "row"}', '{"parts": 0}',
                                 '{"parts": true}', '{"joint_parts": 0}',
                                 '{"joint_tail_rows": -1}', '{"tail_splits": 0}'])
def test_a_bad_override_is_refused_with_the_keys_it_takes(monkeypatch, raw):
    monkeypatch.setenv('LINGBOT_MAP_FA3_CONFIG', raw)
    with pytest.raises(ValueError, match='LINGBOT_MAP_FA3_CONFIG'):
        fa3_config()


def test_unit_scale_queries_round_to_e4m3_and_saturate_instead_of_overflowing():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(50, 4, 64, generator=gen) * 2.0
    q[0, 0, :3] = torch.tensor([1000.0, -1000.0, 448.0])
    q8 = unit_scale_queries(q)
    assert q8.dtype == torch.float8_e4m3fn
    back = q8.float()
    assert not torch.isnan(back).any()
    assert back[0, 0, :3].tolist() == [448.0, -448.0, 448.0]
    body = q[1:]
    # e4m3 keeps 3 mantissa bits: relative rounding <= 2^-4 for normal values.
    normal = body.abs() >= 2.0 ** -6
    rel = ((back[1:] - body).abs() / body.abs())[normal]
    assert rel.max().item() <= 2.0 ** -4 + 1e-6
    assert ((back[1:] - body).norm() / body.norm()).item() < 4e-2


def test_the_triton_kernel_override_takes_known_keys_and_refuses_others(monkeypatch):
    from lingbot_map_ros.engine.attention.triton_backend import KERNEL_CONFIG, kernel_config
    monkeypatch.delenv('LINGBOT_MAP_TRITON_CONFIG', raising=False)
    assert kernel_config() == KERNEL_CONFIG
    monkeypatch.setenv('LINGBOT_MAP_TRITON_CONFIG', '{"splits": 4, "qk_fp8": false}')
    assert kernel_config() == {**KERNEL_CONFIG, 'splits': 4, 'qk_fp8': False}
    for raw in ('{"tiles": 3}', '[4]', '{splits: 4}'):
        monkeypatch.setenv('LINGBOT_MAP_TRITON_CONFIG', raw)
        with pytest.raises(ValueError, match='LINGBOT_MAP_TRITON_CONFIG'):
            kernel_config()
