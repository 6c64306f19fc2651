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
"""The long-sequence fidelity gate and ``lingbot_map_bench fidelity``.

CPU: the gate's arithmetic on hand-made poses and depths whose errors are known by
construction, its pass/fail rule at and around the limits, a small set made on the CPU
(``fidelity_set.py``: tiny model, float64 reference) run through the tool (the reference path
passes with errors near 0, a perturbed run fails naming the error, a CUDA backend is skipped
with its reason). GPU (marked): the default combination of ``config/lingbot_map.yaml`` on
``stream_D`` passes.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from lingbot_map_ros.config import CacheConfig, ModelConfig
from lingbot_map_ros.tools import bench
from lingbot_map_ros.tools.fidelity_combos import default_axes, parse_combo
from lingbot_map_ros.tools.fidelity_gate import ERROR_NAMES, fidelity_errors, FidelitySet, \
    gate_limits, judge, load_set
from lingbot_map_ros.tools.fidelity_inputs import frames_folder, model_config_for_set
from lingbot_map_ros.tools.fidelity_set import GATE, make_fidelity_set, write_synthetic_frames
import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
YARDSTICK = {'t_mean': 0.05, 't_max': 0.1, 'rot_deg_mean': 0.8, 'rot_deg_max': 1.8,
             'fov_max': 0.07, 'depth_rel_median': 0.004}


def _meta(num_frames: int, size_hw: tuple[int, int] = (8, 12)) -> dict:
    return {'set': 'hand', 'inputs': {'frames': [f'{i}.png' for i in range(num_frames)],
                                      'folder': 'frames', 'size_hw': list(size_hw)},
            'stream': {'scale_frames': 2, 'sliding_window': 3, 'keyframe_interval': 1,
                       'camera_num_iterations': 4},
            'weights': {'version': 'golden v1', 'salt': 0},
            'official_bf16_vs_fp32': dict(YARDSTICK), 'gate': GATE}


def _quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of xyzw quaternions, row by row."""
    ax, ay, az, aw = a.T
    bx, by, bz, bw = b.T
    return np.stack([aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw,
                     aw * bw - ax * bx - ay * by - az * bz], axis=1)


def test_errors_match_values_built_in():
    """Each of the six errors equals the one the run was built to have."""
    rng = np.random.default_rng(3)
    frames = 6
    ref = np.zeros((frames, 9))
    ref[:, :3] = rng.normal(size=(frames, 3))
    q_ref = rng.normal(size=(frames, 4))
    ref[:, 3:7] = q_ref / np.linalg.norm(q_ref, axis=1, keepdims=True)
    ref[:, 7:9] = rng.uniform(0.5, 1.5, size=(frames, 2))
    shift = np.array([0.0, 0.01, 0.02, 0.03, 0.04, 0.1])  # camera-centre error of each frame
    angle_deg = np.array([0.0, 0.5, 1.0, 2.0, 3.0, 10.0])
    axis = rng.normal(size=(frames, 3))
    axis /= np.linalg.norm(axis, axis=1, keepdims=True)
    half = np.radians(angle_deg) / 2
    turn = np.concatenate([axis * np.sin(half)[:, None], np.cos(half)[:, None]], axis=1)
    run = ref.copy()
    run[:, :3] += shift[:, None] * np.array([0.6, 0.0, 0.8])  # |(0.6, 0, 0.8)| = 1
    # Not normalised, and the sign flipped on odd frames: q and -q are one rotation.
    sign = np.where(np.arange(frames) % 2, -2.5, 0.7)[:, None]
    run[:, 3:7] = _quat_multiply(ref[:, 3:7], turn) * sign
    run[:, 7:9] += np.array([[0.01, -0.02], [0, 0], [0.03, 0], [0, -0.05], [0, 0], [0, 0]])
    depth_ref = rng.uniform(0.5, 3.0, size=(frames, 2, 3)).astype(np.float32)
    depth_ref[0, 0, 0] = 0.0  # a zero reference: divided by the 1e-6 floor
    factor = np.linspace(0.0, 0.02, depth_ref.size).reshape(depth_ref.shape)
    depth_run = depth_ref * (1 + factor)
    depth_run[0, 0, 0] = 2e-7
    fset = FidelitySet('hand', Path('hand.json'), _meta(frames, (8, 12)), ref, depth_ref, 4)

    errors = fidelity_errors(run, depth_run, fset)

    floor = np.where(depth_ref == 0, 1e-6, depth_ref).astype(np.float64)
    expected_rel = np.abs(depth_run.astype(np.float64) - depth_ref) / floor
    expected = {'t_mean': shift.mean(), 't_max': 0.1, 'rot_deg_mean': angle_deg.mean(),
                'rot_deg_max': 10.0, 'fov_max': 0.05,
                'depth_rel_median': float(np.median(expected_rel))}
    for name in ERROR_NAMES:
        assert errors[name] == pytest.approx(expected[name], rel=1e-6, abs=1e-9), name


def test_non_finite_outputs_give_infinite_errors():
    fset = FidelitySet('hand', Path('hand.json'), _meta(2), np.tile(
        [0, 0, 0, 0, 0, 0, 1, 1, 1], (2, 1)).astype(float), np.ones((2, 2, 3), np.float32), 4)
    run = fset.pose_enc.copy()
    run[1, 0] = np.nan
    run[1, 4] = np.nan
    depth = fset.depth.copy()
    depth[0, 0, 0] = np.inf
    errors = fidelity_errors(run, depth, fset)
    assert math.isinf(errors['t_max']) and math.isinf(errors['t_mean'])
    assert math.isinf(errors['rot_deg_max'])  # NaN would compare as neither pass nor fail
    verdict = judge(errors, fset.meta)
    assert not verdict.passed and 't_max' in verdict.failed


@pytest.mark.parametrize('name', ERROR_NAMES)
def test_rule_at_and_around_the_limits(name):
    """At its limit an error passes; 0.1 % above it fails, and only that error is named."""
    meta = _meta(1)
    limit = 1.0 if name in GATE['means'] else 1.25
    at_limits = {n: YARDSTICK[n] * (1.0 if n in GATE['means'] else 1.25) for n in ERROR_NAMES}
    verdict = judge(at_limits, meta)
    assert verdict.passed and verdict.ratios[name] == pytest.approx(limit)
    assert verdict.worst_ratio == pytest.approx(1.25)
    over = dict(at_limits, **{name: YARDSTICK[name] * limit * 1.001})
    verdict = judge(over, meta)
    assert not verdict.passed and verdict.failed == (name,)
    assert verdict.ratios[name] == pytest.approx(limit * 1.001)
    under = {n: YARDSTICK[n] * 0.5 for n in ERROR_NAMES}
    assert judge(under, meta).worst_ratio == pytest.approx(0.5)


def test_limits_come_from_the_json():
    meta = _meta(1)
    meta['gate'] = dict(GATE, means_at_most_x_official_bf16=2.0, maxima=['t_max'],
                        means=['rot_deg_mean'])
    assert gate_limits(meta) == {'rot_deg_mean': 2.0, 't_max': 1.25}
    errors = dict.fromkeys(ERROR_NAMES, 100.0)
    errors.update(rot_deg_mean=YARDSTICK['rot_deg_mean'] * 1.9, t_max=YARDSTICK['t_max'])
    assert judge(errors, meta).passed  # errors the gate does not list are not judged
    meta['gate']['maxima'] = ['t_max', 'scale_drift']
    with pytest.raises(ValueError, match='scale_drift'):
        gate_limits(meta)


def test_real_set_loads_and_its_reference_passes_itself():
    """stream_D (when shared/ or .gpu_data/ has it): the format this code was written for."""
    found = _gpu_set()
    if found is None:
        pytest.skip('stream_D not found (../shared/golden/long or .gpu_data/long)')
    fset = load_set(found[0])
    assert fset.depth_stride == 4 and fset.size_hw == (294, 518)
    assert fset.depth.shape == (fset.num_frames, 74, 130)
    errors = fidelity_errors(fset.pose_enc, fset.depth, fset)
    # arccos near 1 turns float64 rounding of the normalised quaternions into ~1e-6 degrees.
    assert max(errors.values()) < 1e-5 and judge(errors, fset.meta).worst_ratio < 1e-5
    config = model_config_for_set(fset.meta)
    assert config == ModelConfig(enable_depth=True, camera_num_iterations=4)


# ---- a set made on the CPU, run through the tool ---------------------------------------------

@pytest.fixture(scope='module')
def tiny_set(tmp_path_factory) -> Path:
    """Make a set of 8 synthetic 56x84 frames (tiny model, N_s 2, W 3, salt 5)."""
    root = tmp_path_factory.mktemp('fidelity')
    names = write_synthetic_frames(root / 'frames', 8, (56, 84))
    return make_fidelity_set(root / 'sets', root / 'frames', names, salt=5)


def test_made_set_records_what_it_was_run_with(tiny_set):
    fset = load_set(tiny_set)
    assert fset.num_frames == 8 and fset.size_hw == (56, 84) and fset.depth.shape == (8, 14, 21)
    assert model_config_for_set(fset.meta).embed_dim == ModelConfig.from_preset('tiny').embed_dim
    assert fset.meta['weights']['salt'] == 5 and fset.meta['stream']['scale_frames'] == 2
    assert frames_folder(fset).resolve() == (tiny_set.parent.parent / 'frames').resolve()
    # The yardstick (FP8 K/V in float32) is well above float32 noise: the gate can tell.
    assert all(v > 1e-5 for v in fset.yardstick.values())


def _run_tool(capsys, tiny_set: Path, *extra: str) -> tuple[int, list[dict]]:
    code = bench.main(['fidelity', '--set', str(tiny_set), '--device', 'cpu', *extra])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith('{"combo"')]
    return code, lines


def test_reference_path_passes_its_own_set(capsys, tiny_set, tmp_path):
    out = tmp_path / 'fidelity.json'
    code, lines = _run_tool(capsys, tiny_set, '--combos',
                            'cache.backend=reference,cache.dtype=bfloat16,fast_path=eager',
                            'cache.backend=sdpa,cache.dtype=bfloat16,fast_path=eager',
                            '--json-out', str(out))
    assert code == 0 and len(lines) == 2
    for line in lines:
        assert line['pass'] is True and line['failed'] == []
        assert line['worst_ratio'] < 1e-2  # float32 against float64: near 0
        assert set(line['errors']) == set(ERROR_NAMES) == set(line['ratios'])
        assert line['errors']['t_max'] < 1e-4 and line['seconds'] >= 0
        assert line['in_effect']['backend'] == line['combo']['cache.backend']
    written = json.loads(out.read_text())
    assert [r['combo'] for r in written['results']] == [line['combo'] for line in lines]
    # --resume keeps what the file holds: nothing runs again, the verdict is the same.
    code, again = _run_tool(capsys, tiny_set, '--combos',
                            'cache.backend=reference,cache.dtype=bfloat16,fast_path=eager',
                            '--json-out', str(out), '--resume')
    assert code == 0 and again == []
    kept = json.loads(out.read_text())['results']
    assert [r['combo'] for r in kept] == [r['combo'] for r in written['results']]
    assert kept[0]['errors'] == written['results'][0]['errors']


def test_perturbed_run_fails_naming_the_errors(capsys, tiny_set):
    """A window of 1 instead of the set's 3: another computation, far outside the gate."""
    code, lines = _run_tool(capsys, tiny_set, '--combos',
                            'cache.backend=sdpa,fast_path=eager,cache.sliding_window=1')
    assert code == 1 and len(lines) == 1
    line = lines[0]
    assert 'error' not in line and line['in_effect']['backend'] == 'sdpa'
    assert line['pass'] is False and 't_mean' in line['failed'] and line['worst_ratio'] > 1.25
    assert line['failed'] == [n for n in ERROR_NAMES if n in line['failed']]


def test_gate_names_a_perturbed_output(tiny_set):
    """The reference with one output disturbed fails on exactly the errors it moves."""
    fset = load_set(tiny_set)
    depth = fset.depth * np.float32(1 + 3 * fset.yardstick['depth_rel_median'])
    assert judge(fidelity_errors(fset.pose_enc, depth, fset), fset.meta).failed == (
        'depth_rel_median',)
    pose = fset.pose_enc.copy()
    pose[-1, 7] += 2 * fset.yardstick['fov_max']
    assert judge(fidelity_errors(pose, fset.depth, fset), fset.meta).failed == ('fov_max',)


def test_cuda_backends_are_skipped_with_the_reason(capsys, tiny_set):
    code = bench.main(['fidelity', '--set', str(tiny_set), '--device', 'cpu', '--combos',
                       'cache.backend=triton', 'cache.backend=fa3'])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith('{')]
    assert [line['pass'] for line in lines[:2]] == [None, None]
    assert all('needs CUDA' in line['skipped'] for line in lines[:2])
    assert lines[-1]['ran'] == 0 and lines[-1]['pass'] is False
    assert code == 1  # nothing ran: nothing was shown to be within the gate


def test_sweep_covers_every_precision_and_starts_with_the_file_values():
    base = {'stream.device': 'cuda', 'stream.dtype': 'bfloat16', 'stream.fast_path':
            'whole_frame', 'stream.compile': True, 'cache.backend': 'auto',
            'cache.dtype': 'float8_e4m3fn', 'stream.camera_head_dtype': 'bfloat16'}
    axes = default_axes(base)
    assert axes['fast_path'][0] == 'whole_frame+compile'
    assert axes['cache.dtype'] == ['float8_e4m3fn', 'bfloat16']
    assert axes['stream.camera_head_dtype'][0] == 'bfloat16'
    assert 'auto' not in axes['cache.backend'] and 'triton' in axes['cache.backend']
    precision = CacheConfig.__dataclass_fields__.get('precision')
    if precision is not None:
        import typing
        values = typing.get_args(typing.get_type_hints(CacheConfig)['precision'])
        assert sorted(axes['cache.precision']) == sorted(values)
    cpu = default_axes(dict(base, **{'stream.device': 'cpu'}))
    assert cpu['fast_path'] == ['eager'] and 'stream.camera_head_dtype' not in cpu
    assert parse_combo('default') == {}
    assert parse_combo('cache.backend=fa3,stream.compile=false') == {
        'cache.backend': 'fa3', 'stream.compile': False}


# ---- GPU -------------------------------------------------------------------------------------

def _gpu_set() -> tuple[Path, Path] | None:
    """Find stream_D and its frames: $LINGBOT_FIDELITY_SET/_FRAMES, .gpu_data/, ../shared."""
    candidates = [(os.environ.get('LINGBOT_FIDELITY_SET'),
                   os.environ.get('LINGBOT_FIDELITY_FRAMES')),
                  (ROOT / '.gpu_data' / 'long' / 'stream_D', ROOT / '.gpu_data' / 'loop'),
                  (ROOT / 'gpu_data' / 'long' / 'stream_D', ROOT / 'gpu_data' / 'loop'),
                  (ROOT.parent / 'shared' / 'golden' / 'long' / 'stream_D',
                   ROOT.parent / 'shared' / 'data' / 'loop')]
    for set_path, frames in candidates:
        if set_path and frames and Path(f'{set_path}.json').is_file() and Path(frames).is_dir():
            return Path(set_path), Path(frames)
    return None


@pytest.mark.gpu
def test_default_gpu_combination_passes_stream_d(capsys):
    if not torch.cuda.is_available():
        pytest.skip('needs CUDA')
    found = _gpu_set()
    if found is None:
        pytest.skip('stream_D and its frames not found (.gpu_data/long, .gpu_data/loop)')
    set_path, frames = found
    code = bench.main(['fidelity', '--set', str(set_path), '--frames-dir', str(frames),
                       '--combos', 'default'])
    out = capsys.readouterr().out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith('{"combo"')]
    assert len(lines) == 1, out[-3000:]
    assert 'skipped' not in lines[0], lines[0]
    assert lines[0]['pass'] is True and code == 0, lines[0]
