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
"""``lingbot_map_bench cache`` on CPU at a small shape, and the bench tool's subcommand loading.

Run: ``python -m pytest test/tools/test_bench_cache.py`` (repo root; CPU only, a few seconds).
"""

import json

from lingbot_map_ros.tools import bench
import pytest

SMALL = ['cache', '--device', 'cpu', '--dtype', 'float32', '--patches', '64', '--frames', '20',
         '--scale-frames', '2', '--window', '4', '--heads', '2', '--head-dim', '16',
         '--layers', '3', '--iters', '2', '--warmup', '1', '--host-frames', '4']


def test_cache_bench_small_shape_on_cpu(capsys):
    assert bench.main(SMALL) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    # Keys of a keyframe at the timed state: (N_s + W) patch pages + 6 specials per frame.
    assert result['num_keys'] == (2 + 4) * 64 + 6 * 20
    assert set(result['results']) == {'sdpa', 'reference', 'dense'}
    for name in ('sdpa', 'reference'):
        row = result['results'][name]
        assert row['ms_per_layer'] > 0 and row['host_us_keyframe'] > 0
        assert row['tflops'] == pytest.approx(
            4 * 70 * result['num_keys'] * 2 * 16 / row['ms_per_layer'] / 1e9)
    assert any(line.startswith('sdpa ') for line in lines[:-1])


def test_every_subcommand_is_wired():
    parser = bench.build_parser()
    assert parser.parse_args(SMALL).run.__module__ == 'lingbot_map_ros.tools.bench_cache'
    assert parser.parse_args(['model']).run.__module__ == 'lingbot_map_ros.tools.bench_model'


def test_import_errors_are_not_hidden(monkeypatch):
    monkeypatch.setitem(bench.SUBCOMMANDS, 'model', 'no_such_package.bench_model')
    with pytest.raises(ModuleNotFoundError, match='no_such_package'):
        bench.build_parser()


def test_fast_path_flag_and_its_aliases():
    parser = bench.build_parser()
    assert parser.parse_args(['model']).fast_path == 'whole_frame'
    assert parser.parse_args(['model', '--fast-path', 'segments']).fast_path == 'segments'
    assert parser.parse_args(['model', '--cuda-graphs']).fast_path == 'whole_frame'
    assert parser.parse_args(['model', '--no-cuda-graphs']).fast_path == 'eager'
    with pytest.raises(SystemExit):
        parser.parse_args(['model', '--fast-path', 'graphs'])
