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
"""Official state-dict names and shapes vs ``shared/docs/state_dict_keys.json``.

Run: ``python -m pytest test/engine/test_state_dict_keys.py`` (repo root; needs ../shared beside
the repository). The model is built on the 'meta' device, so no weights are allocated.
"""

import json

from lingbot_map_ros.config import ModelConfig
from lingbot_map_ros.engine.model.gct import LingbotMapModel
import pytest
import torch


@pytest.fixture(scope='module')
def official_keys(shared_file) -> dict:
    return json.loads(shared_file('docs', 'state_dict_keys.json').read_text(encoding='utf-8'))


def _meta_shapes(config: ModelConfig) -> dict[str, list[int]]:
    with torch.device('meta'):
        model = LingbotMapModel(config)
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def test_official_names_and_shapes(official_keys):
    shapes = _meta_shapes(ModelConfig())
    expected = official_keys['state_dict']
    assert sorted(set(expected) - set(shapes)) == []
    assert sorted(set(shapes) - set(expected)) == []
    assert {k: v for k, v in shapes.items() if expected[k] != v} == {}
    assert len(shapes) == official_keys['_meta']['num_keys'] == 1342
    num_params = sum(torch.Size(s).numel() for s in shapes.values())
    assert num_params == official_keys['_meta']['num_params'] == 1_157_943_540


def test_no_depth_head_drops_only_depth_keys(official_keys):
    shapes = _meta_shapes(ModelConfig(enable_depth=False))
    expected = {k for k in official_keys['state_dict'] if not k.startswith('depth_head.')}
    assert set(shapes) == expected
