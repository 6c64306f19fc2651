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
"""``lingbot_map_bench memory`` on the CPU: a short run of the tiny model through every phase.

Run: ``python -m pytest test/tools/test_bench_memory.py`` (repo root; CPU only, ~15 s).
"""

import json

from lingbot_map_ros.tools import bench
import pytest

SHORT = ['memory', '--config', 'demo_tiny_cpu.yaml', '--height', '28', '--width', '42',
         '--steady', '2', '--depth', '--scale-head-chunk', '2',
         '--set', 'cache.scale_frames=2', '--set', 'cache.sliding_window=2',
         '--set', 'stream.overlap_keyframes=2']


def test_memory_bench_runs_every_phase_on_the_cpu(capsys):
    assert bench.main(SHORT) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert [p['phase'] for p in result['phases']] == [
        'weights', 'warm-up/capture', 'phase 1', 'streaming', 'rollover']
    # The run is cut so that the session rolls over right after the steady frames.
    assert result['rollovers'] == 1 and result['rollover_ms'] > 0
    assert result['phase1_ms'] > 0 and result['ms_p50'] > 0
    assert (result['scale_frames'], result['window'], result['depth']) == (2, 2, True)
    assert result['scale_head_chunk'] == 2
    # No CUDA: no memory numbers, never made-up ones.
    assert result['peak_allocated_gib'] is None and result['peak_reserved_gib'] is None
    assert all(p['max_reserved_gib'] is None for p in result['phases'])
    assert result['kv_gib'] > 0 and result['weights_gib']['depth_head'] > 0
    assert lines[0].startswith('weights')


def test_memory_bench_is_a_subcommand_and_rejects_a_bad_run():
    parser = bench.build_parser()
    args = parser.parse_args(['memory', '--steady', '0'])
    assert args.run.__module__ == 'lingbot_map_ros.tools.bench_memory'
    with pytest.raises(ValueError, match='--steady=0'):
        args.run(args)
