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
"""``cache.kernel`` (``KernelConfig``): defaults, checks, and the kernels and forms built from it.

Run: ``python -m pytest test/engine/test_kernel_config.py`` (the GPU tests need CUDA, Triton and,
for FA3, a Hopper GPU with the fa3-fwd wheel).
"""

from __future__ import annotations

import dataclasses

from lingbot_map_ros.config import CacheConfig, EngineConfig, KernelConfig
from lingbot_map_ros.engine.attention.triton_backend import triton_kernel_args
from lingbot_map_ros.engine.runner.batch_runs import BatchRuns
from lingbot_map_ros.engine.runner.fast_path import FastPathState
from lingbot_map_ros.kernel_config import kernel_from_json
import pytest
# tiny_engine sits next to this file (pytest puts test/engine on sys.path).
from tiny_engine import random_frame, tiny_config, tiny_session
import torch


def test_the_defaults_are_the_tuned_values_the_kernels_ran_with():
    kernel = KernelConfig()
    assert dataclasses.asdict(kernel) == {
        'triton_block_m': 128, 'triton_block_n': 64, 'triton_num_warps': 8,
        'triton_num_stages': 3, 'triton_splits': 2, 'triton_qk': 'auto',
        'fa3_parts': 4, 'fa3_joint_parts': 4, 'fa3_joint_tail_rows': 64,
        'fa3_tail_splits': 16, 'fa3_splits': 1, 'fa3_query_scale': 'unit',
        'staged_runs': True, 'lanes': True}
    assert CacheConfig().kernel == kernel and kernel.changed() == {}
    # What attend_run is given: the tiles, and the query terms as the precision says.
    assert triton_kernel_args(kernel) == {'block_m': 128, 'block_n': 64, 'num_warps': 8,
                                          'num_stages': 3, 'splits': 2, 'qk_split': True}
    assert triton_kernel_args(kernel, 'fast_approximate')['qk_split'] is False


def test_a_field_set_reaches_the_kernel_arguments():
    kernel = KernelConfig(triton_block_m=64, triton_splits=4, triton_qk='widened')
    assert triton_kernel_args(kernel) == {'block_m': 64, 'block_n': 64, 'num_warps': 8,
                                          'num_stages': 3, 'splits': 4, 'qk_fp8': False,
                                          'qk_split': True}
    for qk, split in (('single', False), ('split', True), ('auto', False)):
        args = triton_kernel_args(KernelConfig(triton_qk=qk), 'fast_approximate')
        assert args['qk_split'] is split and 'qk_fp8' not in args
    assert kernel.changed() == {'triton_block_m': 64, 'triton_splits': 4,
                                'triton_qk': 'widened'}


@pytest.mark.parametrize('field,value,match', [
    ('triton_block_m', 100, 'triton_block_m=100 must be a power of two in \\[16, 256\\]'),
    ('triton_block_n', 512, 'triton_block_n=512 must be a power of two'),
    ('triton_num_warps', 3, 'triton_num_warps=3 must be a power of two in \\[1, 16\\]'),
    ('triton_num_stages', 0, 'triton_num_stages=0 must be an integer in \\[1, 8\\]'),
    ('triton_splits', 0, 'triton_splits=0 must be an integer in \\[1, 1024\\]'),
    ('triton_splits', 2.0, 'triton_splits=2.0 must be an integer'),
    ('fa3_parts', True, 'fa3_parts=True must be an integer'),
    ('fa3_joint_parts', 0, 'fa3_joint_parts=0'),
    ('fa3_tail_splits', 0, 'fa3_tail_splits=0'),
    ('fa3_joint_tail_rows', 192, 'fa3_joint_tail_rows=192 must be an integer in \\[0, 191\\]'),
    ('fa3_splits', -1, 'fa3_splits=-1 must be an integer in \\[0, 1024\\]'),
    ('triton_qk', 'fp8', "triton_qk='fp8' is not one of auto, split, single, widened"),
    ('fa3_query_scale', 'row', "fa3_query_scale='row' is not one of head, unit"),
    ('staged_runs', 0, 'staged_runs=0 must be true or false'),
])
def test_a_bad_value_is_refused_naming_the_parameter(field, value, match):
    with pytest.raises(ValueError, match=f'cache.kernel.{match}'):
        KernelConfig(**{field: value})


def test_one_query_term_is_refused_under_the_faithful_precision():
    with pytest.raises(ValueError, match="triton_qk='single'.*fast_approximate"):
        CacheConfig(kernel=KernelConfig(triton_qk='single'))
    cache = CacheConfig(precision='fast_approximate', kernel=KernelConfig(triton_qk='single'))
    assert cache.kernel.triton_qk == 'single'


def test_flat_keys_carry_the_section():
    config = EngineConfig.from_flat({'cache.kernel.triton_splits': 4,
                                     'cache.kernel.lanes': False, 'cache.backend': 'sdpa'})
    assert config.cache.kernel == KernelConfig(triton_splits=4, lanes=False)
    flat = config.to_flat()
    assert flat['cache.kernel.triton_splits'] == 4 and flat['cache.kernel.lanes'] is False
    assert EngineConfig.from_flat(flat) == config
    for bad in ('cache.kernel', 'cache.kernel.splits', 'cache.kernel.triton_splits.x'):
        with pytest.raises(ValueError, match=f"unknown engine setting '{bad}'"):
            EngineConfig.from_flat({bad: 1})


def test_a_benchmark_override_is_json_of_fields():
    assert kernel_from_json('{}') == KernelConfig()
    assert kernel_from_json('{"fa3_joint_parts": 2, "staged_runs": false}') == \
        KernelConfig(fa3_joint_parts=2, staged_runs=False)
    base = KernelConfig(triton_splits=4)
    assert kernel_from_json('{"lanes": false}', base) == KernelConfig(triton_splits=4,
                                                                      lanes=False)
    for text, match in (('not json', 'not JSON'), ('[1]', 'JSON object with keys from'),
                        ('{"splits": 1}', 'JSON object with keys from'),
                        ('{"triton_splits": 0}', 'triton_splits=0')):
        with pytest.raises(ValueError, match=match):
            kernel_from_json(text)


def test_the_environment_sets_nothing(monkeypatch):
    # The benchmarks' old environment overrides are gone: only fields tune the kernels.
    monkeypatch.setenv('LINGBOT_MAP_TRITON_CONFIG', '{"splits": 7}')
    monkeypatch.setenv('LINGBOT_MAP_STAGED_RUNS', '0')
    assert triton_kernel_args(tiny_config().cache.kernel)['splits'] == 2
    assert tiny_config().cache.kernel.staged_runs is True


def test_the_session_builds_its_pool_and_batches_with_the_fields_and_reports_them():
    session = tiny_session({'cache.kernel.triton_splits': 4, 'cache.kernel.staged_runs': False,
                            'cache.kernel.lanes': False})
    assert session.stats().cache is None  # no pool before the first frame
    session.step(random_frame(0), tag=1)
    engine = session.engine
    assert engine.pool.kernel == KernelConfig(triton_splits=4, staged_runs=False, lanes=False)
    cache = session.stats().cache
    assert cache.kernel == engine.pool.kernel.summary()
    assert 'triton_splits=4' in cache.kernel and 'staged_runs=false' in cache.kernel
    assert engine.runner.batches.lanes.overlap is False
    default = BatchRuns(engine.model.aggregator, FastPathState())
    assert default.lanes.overlap is True  # the default form


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_the_triton_backend_is_built_with_the_fields():
    pytest.importorskip('triton')
    from lingbot_map_ros.engine.attention.backend import make_backend
    kernel = KernelConfig(triton_block_m=64, triton_splits=4)
    backend = make_backend('triton', num_heads=2, head_dim=64, page_size=16, num_pages=4,
                           dtype=torch.bfloat16, device=torch.device('cuda'), kernel=kernel)
    assert backend.kernel.args == triton_kernel_args(kernel)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_the_fa3_backend_is_built_with_the_fields():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip('FA3 needs a Hopper GPU')
    pytest.importorskip('fa3_fwd_interface')
    from lingbot_map_ros.engine.attention.backend import make_backend
    kernel = KernelConfig(fa3_parts=2, fa3_joint_parts=8, fa3_tail_splits=8)
    backend = make_backend('fa3', num_heads=2, head_dim=64, page_size=16, num_pages=4,
                           dtype=torch.bfloat16, device=torch.device('cuda'), kernel=kernel)
    assert backend.kernel.config == kernel
    from lingbot_map_ros.engine.attention.fa3 import Fa3RunAttention
    # An argument replaces its field (the benchmarks' candidates), the rest stay.
    assert Fa3RunAttention(parts=1, config=kernel).config == dataclasses.replace(kernel,
                                                                                 fa3_parts=1)
