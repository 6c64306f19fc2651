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
"""The pacing report of ``lingbot_map_bench loop`` (counts only; its timings are the GPU's).

Run: ``python -m pytest test/tools/test_bench_loop.py`` (~10 s: one tiny CPU bench run).
"""

from __future__ import annotations

import argparse

from lingbot_map_ros.config import LoopConfig
from lingbot_map_ros.tools import bench_loop
import pytest

TINY = ['--preset', 'tiny', '--device', 'cpu', '--height', '84', '--width', '112',
        '--frames', '60', '--scale-frames', '4', '--window', '4', '--checks', '1',
        '--dtype', 'float32', '--backend', 'sdpa']


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_loop.add_arguments(parser)
    return parser.parse_args([*TINY, *extra])


def test_the_interval_defaults_to_the_config_and_refuses_0():
    assert _args().verify_unit_interval == LoopConfig.verify_unit_interval
    with pytest.raises(ValueError, match='loop.verify_unit_interval=0 must be >= 1'):
        bench_loop.run(_args('--verify-unit-interval', '0'))


def test_the_report_counts_units_per_frame_and_check_latency_in_frames():
    result = bench_loop.run(_args())
    units = result['check']['units']
    n = LoopConfig.verify_unit_interval
    assert n > 1 and units > 1 and result['verify_unit_interval'] == n
    paced, every_frame = result['phases']['verifying'], result['phases']['back_to_back']
    frames = paced['num_frames']
    assert frames == every_frame['num_frames'] == 60 - 4  # the scale frames are not timed
    # The default N: frames 1, 1 + N, 1 + 2N, ... carry a unit; a check spans (units - 1) * N + 1
    # frames.
    assert paced['verify_unit_interval'] == n
    assert paced['units_run'] == (frames + n - 1) // n
    assert paced['units_per_frame'] == pytest.approx(paced['units_run'] / frames, abs=1e-4)
    assert paced['min_frames_between_units'] == n
    assert paced['checks_completed'] == paced['units_run'] // units
    assert paced['check_latency_frames_max'] == (units - 1) * n + 1
    # N = 1: a unit beside every frame, a check spans its units.
    assert every_frame['verify_unit_interval'] == 1
    assert every_frame['units_run'] == frames and every_frame['units_per_frame'] == 1.0
    assert every_frame['min_frames_between_units'] == 1
    assert every_frame['checks_completed'] == frames // units
    assert every_frame['check_latency_frames_mean'] == pytest.approx(units)
    assert isinstance(result['meets_targets'], bool)
    assert result['verifying_mean_overhead'] == pytest.approx(
        paced['mean_ms'] / result['phases']['off']['mean_ms'] - 1.0, abs=1e-3)
