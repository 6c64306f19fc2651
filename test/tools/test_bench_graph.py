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
"""``lingbot_map_bench graph`` on a tiny run: its report's shape and values (no timing bounds).

Run: ``python -m pytest test/tools/test_bench_graph.py`` (CPU, needs gtsam; ~15 s: one
200-keyframe run and its memory pass in a spawned process).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math

from lingbot_map_ros.loop_config import LoopConfig
from lingbot_map_ros.tools import bench, bench_graph
import numpy as np
import pytest

pytest.importorskip('gtsam')

TINY = ['graph', '--keyframes', '200', '--loops', '2', '--wrong', '1']


@pytest.fixture(scope='module')
def report():
    """Run the CLI once; return its printed lines and its last line's JSON."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = bench.main(TINY)
    assert status == 0
    lines = out.getvalue().strip().splitlines()
    return lines, json.loads(lines[-1])


def test_the_last_line_is_the_json_of_each_size(report):
    lines, result = report
    assert result['benchmark'] == 'graph' and result['loops'] == 2
    assert list(result['sizes']) == ['200']
    size = result['sizes']['200']
    assert set(size) == {'add_ms', 'covariance_ms', 'loop_ms', 'loops_kept', 'loop_residuals',
                         'read_ms', 'error_m', 'batch', 'memory', 'wrong', 'stats'}
    assert any(line.split()[:1] == ['200'] for line in lines[:-1])  # the table's row


def test_times_are_positive_and_the_true_loop_is_kept(report):
    size = report[1]['sizes']['200']
    for value in (*size['add_ms'].values(), *size['covariance_ms'].values(),
                  *size['loop_ms'].values(), size['read_ms'],
                  size['batch']['solve_ms']):
        assert math.isfinite(value) and value > 0
    assert size['add_ms']['p99'] >= size['add_ms']['mean']
    assert size['loops_kept'] == 2
    assert all(0 <= r <= LoopConfig.max_residual for r in size['loop_residuals'])


def test_the_wrong_loop_is_refused_live_and_in_batch(report):
    size = report[1]['sizes']['200']
    assert size['wrong']['loops'] == 1 and size['wrong']['wrong_kept'] == 0
    assert math.isfinite(size['wrong']['judge_ms']) and size['wrong']['judge_ms'] > 0
    assert size['batch']['rejected'] == 1 and size['batch']['wrong_kept'] == 0
    stats = size['stats']
    assert stats['nodes'] == 200 and stats['loops'] == 2 and stats['recoveries'] == 0
    assert stats['rejected_gate'] + stats['rejected_residual'] == 1


def test_the_loop_lowers_the_trajectory_error_below_the_odometry(report):
    error = report[1]['sizes']['200']['error_m']
    assert error['odometry'] > 0.05  # the odometry does drift
    # Seed 0: 0.21 m of odometry error becomes 0.09 m with the loop back at the start.
    assert error['graph'] < 0.7 * error['odometry']
    # iSAM2's updates reach the batch solve's optimum.
    batch = report[1]['sizes']['200']['batch']
    assert batch['error_m'] == pytest.approx(error['graph'], rel=0.1)


def test_memory_growth_is_measured_in_a_fresh_process(report):
    result = report[1]
    memory = result['sizes']['200']['memory']
    assert memory['method'] == 'rss' and memory['measured_keyframes'] == 180
    assert memory['candidates'] == 0 and memory['errors'] == 0  # no verification ran
    assert math.isfinite(memory['mb_per_1000']) and memory['mb_per_1000'] > 0
    assert memory['rss_end_mb'] > memory['rss_start_mb']
    assert result['meets_targets'] == (memory['mb_per_1000'] <= 50.0)


def test_the_loops_return_to_the_places_of_the_first_keyframes():
    config = LoopConfig()
    truth, odom = bench_graph.drifting_run(300, lap=100, loops=3, gap=10, noise=0.5, seed=0,
                                           config=config)
    pairs = bench_graph.loop_keyframes(300, 3, 10)
    assert pairs == [(0, 279), (10, 289), (20, 299)]
    for place, query in pairs:
        assert np.linalg.norm(truth[place, :3, 3] - truth[query, :3, 3]) < 1e-9
    assert np.allclose(odom[0], truth[0])
    steps = np.linalg.norm(np.diff(truth[:, :3, 3], axis=0), axis=1)
    assert steps.min() > 0.5 * bench_graph.STEP_M and steps.max() < 2 * bench_graph.STEP_M


def test_too_short_a_run_for_its_loops_is_refused():
    parser = argparse.ArgumentParser()
    bench_graph.add_arguments(parser)
    with pytest.raises(ValueError, match='needs at least 121'):
        bench_graph.run(parser.parse_args(['--keyframes', '120', '--loops', '3']))
    with pytest.raises(ValueError, match='--noise=-1.0 must be'):
        bench_graph.run(parser.parse_args(['--keyframes', '200', '--noise', '-1']))
    with pytest.raises(ValueError, match='--wrong'):
        bench_graph.run(parser.parse_args(['--keyframes', '200', '--loops', '1']))
