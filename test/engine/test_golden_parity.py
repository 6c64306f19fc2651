"""Golden parity: the whole streaming model vs the upstream float64 reference (sets A and B).

Run: ``python -m pytest -m slow test/engine/test_golden_parity.py`` from the repository root.
Needs ``../shared/golden`` beside the repository, about 5 GB of RAM (the full model in float32,
built once for both sets) and a few minutes on 2 CPU cores. It calls the same code as
``lingbot_map_golden`` (``tools/golden.py: run_golden``).
"""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from lingbot_map_ros.tools.golden import (build_golden_model, DTYPES, model_config_from_json,
                                          run_golden)

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).resolve().parents[2] / '..' / 'shared' / 'golden'
SETS = ('A', 'B')


def _meta(name: str) -> dict:
    return json.loads((GOLDEN / f'stream_{name}.json').read_text(encoding='utf-8'))


@pytest.fixture(scope='module')
def golden_model():
    if not (GOLDEN / 'stream_A.safetensors').is_file():
        pytest.skip(f'{GOLDEN} not found (shared/ must sit beside the repository)')
    metas = [_meta(name) for name in SETS]
    config = model_config_from_json(metas[0])
    # Both public sets use the same weights and model; reuse one model for both.
    assert all(model_config_from_json(m) == config for m in metas)
    assert len({m['weights']['salt'] for m in metas}) == 1
    model = build_golden_model(config, metas[0]['weights']['salt'], DTYPES['float32'])
    yield model
    del model


@pytest.mark.parametrize('name,backend', [('A', 'reference'), ('B', 'reference'), ('B', 'sdpa')])
def test_stream_matches_reference(golden_model, name, backend):
    report = run_golden(GOLDEN / f'stream_{name}.safetensors', dtype='float32', backend=backend,
                        model=golden_model)
    failed = {k: v for k, v in report['checks'].items() if not v['pass']}
    assert failed == {}
    tol = _meta(name)['tolerances']
    assert report['checks']['pose_enc']['tol'] == tol['pose_enc']['atol']
    assert set(report['checks']) >= {'pose_enc', 'pose_enc_iters', 'depth', 'depth_conf',
                                     'dino_patch_tokens', 'taps_layer4', 'taps_layer23',
                                     'keyframe_mask', 'time_index', 'cache_schedule'}


@pytest.mark.parametrize('name', SETS)
def test_golden_schedule_follows_keyframe_rule(name):
    # The stored schedule, derived here from the README rule, independently of tools/golden.py
    if not (GOLDEN / f'stream_{name}.safetensors').is_file():
        pytest.skip(f'{GOLDEN} not found')
    ref = load_file(str(GOLDEN / f'stream_{name}.safetensors'))
    stream = _meta(name)['stream']
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
