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
"""Golden parity: the whole streaming model vs the upstream float64 reference (sets A and B).

Run: ``python -m pytest test/engine/test_golden_parity.py`` from the repository root (add
``-m 'not slow'`` for the fast checks of the comparison and the schedule only).
Needs ``../shared/golden`` beside the repository (found through ``test/conftest.py``), about
5 GB of RAM (the full model in float32, built once for both sets) and a few minutes on 2 CPU
cores. It calls the same code as
``lingbot_map_golden`` (``tools/golden.py: run_golden``).
"""

import json
from pathlib import Path

from lingbot_map_ros.tools.golden import build_golden_model, DTYPES, model_config_from_json, \
    run_golden
from lingbot_map_ros.tools.golden_compare import compare
import pytest
from safetensors.torch import load_file

SETS = ('A', 'B')


def _meta(golden: Path, name: str) -> dict:
    return json.loads((golden / f'stream_{name}.json').read_text(encoding='utf-8'))


@pytest.fixture(scope='module')
def golden(shared_file) -> Path:
    return shared_file('golden', 'stream_A.safetensors').parent


@pytest.fixture(scope='module')
def golden_model(golden):
    metas = [_meta(golden, name) for name in SETS]
    config = model_config_from_json(metas[0])
    # Both public sets use the same weights and model; reuse one model for both.
    assert all(model_config_from_json(m) == config for m in metas)
    assert len({m['weights']['salt'] for m in metas}) == 1
    model = build_golden_model(config, metas[0]['weights']['salt'], DTYPES['float32'])
    yield model
    del model


@pytest.mark.slow
@pytest.mark.parametrize('name,backend', [('A', 'reference'), ('B', 'reference'), ('B', 'sdpa')])
def test_stream_matches_reference(golden_model, golden, name, backend):
    report = run_golden(golden / f'stream_{name}.safetensors', dtype='float32', backend=backend,
                        model=golden_model)
    failed = {k: v for k, v in report['checks'].items() if not v['pass']}
    assert failed == {}
    tol = _meta(golden, name)['tolerances']
    assert report['checks']['pose_enc']['tol'] == tol['pose_enc']['atol']
    assert set(report['checks']) >= {'pose_enc', 'pose_enc_iters', 'depth', 'depth_conf',
                                     'dino_patch_tokens', 'taps_layer4', 'taps_layer23',
                                     'keyframe_mask', 'time_index', 'cache_schedule'}


@pytest.mark.parametrize('name', SETS)
def test_golden_schedule_follows_keyframe_rule(golden, name):
    # The stored schedule, derived here from the README rule, independently of tools/golden.py
    ref = load_file(str(golden / f'stream_{name}.safetensors'))
    stream = _meta(golden, name)['stream']
    num_scale, interval = stream['num_scale_frames'], stream['keyframe_interval']
    mask, times, cached = [], [], 0
    for i in range(stream['num_frames']):
        is_key = i < num_scale or interval <= 1 or (i - num_scale) % interval == 0
        mask.append(is_key)
        times.append(cached)
        cached += is_key
    assert ref['keyframe_mask'].tolist() == mask
    assert ref['time_index'].tolist() == times
    if name == 'B':  # README table: a non-keyframe shares the next keyframe's index
        assert times == [0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7]


def test_compare_flags_errors_beyond_tolerance(golden):
    # The reference compared with itself passes; a perturbation of 2x the tolerance fails.
    ref = load_file(str(golden / 'stream_B.safetensors'))
    meta = _meta(golden, 'B')
    schedule = [dict(s['cache_after_call'],
                     attended_keys_global_block=s['attended_keys_global_block'])
                for s in meta['schedule']]
    result = {'pose_enc': ref['pose_enc'].clone(), 'pose_enc_iters': ref['pose_enc_iters'],
              'depth': ref['depth'], 'depth_conf': ref['depth_conf'],
              'dino': ref['dino_patch_tokens'], 'taps': ref['taps'].clone(),
              'keyframe_mask': ref['keyframe_mask'].tolist(),
              'time_index': ref['time_index'].tolist(), 'schedule': schedule}
    assert all(c['pass'] for c in compare(result, ref, meta).values())
    result['pose_enc'][5, 2] += 2 * meta['tolerances']['pose_enc']['atol']
    result['taps'][1, 2, 3, 4] -= 2 * meta['tolerances']['taps']['atol_per_layer']['17']
    result['time_index'][7] += 1
    result['schedule'][9] = dict(schedule[9], attended_keys_global_block=162)
    failed = {k for k, c in compare(result, ref, meta).items() if not c['pass']}
    assert failed == {'pose_enc', 'taps_layer17', 'time_index', 'cache_schedule'}
