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
"""The long-run report of ``lingbot_map_bench model`` (block means, flatness, rollover cost).

Run: ``python -m pytest test/tools/test_bench_rollover.py`` (instant).
"""

from __future__ import annotations

from lingbot_map_ros.tools.bench_rollover import block_report
import pytest


def test_refill_blocks_count_in_flatness_all_but_not_in_flatness_steady():
    # 10 ms frames; a rollover at call 450 costs 40 ms and its W = 20 refill frames take 8 ms.
    times = [100.0] + [10.0] * 799
    times[450] = 40.0
    times[451:471] = [8.0] * 20
    report = block_report(times, [450], window=20, block=100, peaks_gib=[2.0] * 8)
    assert report['block_ms'][4] == pytest.approx((99 * 10.0 + 40.0 - 20 * 2.0) / 100)
    assert report['flatness_all'] == pytest.approx(10.0 / report['block_ms'][4], abs=1e-4)
    assert report['flatness_steady'] == pytest.approx(1.0) and report['steady_blocks'] == 6
    assert report['rollover_ms_max'] == pytest.approx(40.0)
    assert report['rollover_over_median'] == pytest.approx(4.0)
    assert report['peak_flatness'] == pytest.approx(1.0)


def test_without_rollovers_the_latency_fields_are_none():
    report = block_report([50.0] + [10.0] * 299, [], window=4, block=100)
    assert report['rollovers'] == 0 and report['rollover_ms_max'] is None
    assert report['flatness_all'] == pytest.approx(1.0) and 'peak_gib_per_block' not in report


def test_preparation_frames_are_reported_apart_and_kept_out_of_the_steady_blocks():
    # 10 ms frames; a next session prepared over calls 420..449 (12 ms each), a rollover at
    # call 450 that only switches (11 ms), its W = 20 refill frames at 8 ms.
    times = [100.0] + [10.0] * 799
    times[420:450] = [12.0] * 30
    times[450] = 11.0
    times[451:471] = [8.0] * 20
    report = block_report(times, [450], window=20, block=100,
                          peaks_gib=[2.0, 2.0, 2.0, 2.0, 2.7, 2.0, 2.0, 2.0],
                          prepare_at=list(range(420, 450)))
    assert report['prepare_frames'] == 30
    assert report['prepare_ms_mean'] == pytest.approx(12.0)
    assert report['prepare_over_median'] == pytest.approx(1.2)
    assert report['rollover_over_median'] == pytest.approx(1.1)
    assert report['max_streaming_over_median'] == pytest.approx(1.2)
    # Block 4 holds the preparation, the switch and the refill: not steady.
    assert report['flatness_steady'] == pytest.approx(1.0) and report['steady_blocks'] == 6
    assert report['peak_gib_with_rollover'] == pytest.approx(2.7)
    assert report['peak_gib_without_rollover'] == pytest.approx(2.0)
