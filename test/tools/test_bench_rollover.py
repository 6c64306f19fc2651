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
"""The long-run report of ``lingbot_map_bench model`` (block means, rollover cost, live drops).

Run: ``python -m pytest test/tools/test_bench_rollover.py`` (~5 s: one tiny CPU bench run).
"""

from __future__ import annotations

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.image.preprocess import preprocess_image
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.ros.inference.worker import LIVE_CAPACITY
from lingbot_map_ros.tools import bench
from lingbot_map_ros.tools.bench_model import stream_frames
from lingbot_map_ros.tools.bench_rollover import block_report, live_drop_report, live_drops
import numpy as np
import pytest
import torch


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
    # The slowest calls after block 0: the preparation frames, in call order among equals.
    assert [(e['index'], e['ms'], e['kind']) for e in report['slowest']] == [
        (420, pytest.approx(12.0), 'prepare'), (421, pytest.approx(12.0), 'prepare'),
        (422, pytest.approx(12.0), 'prepare'), (423, pytest.approx(12.0), 'prepare'),
        (424, pytest.approx(12.0), 'prepare')]


def test_slowest_names_the_rollover_and_a_plain_frame():
    times = [100.0] + [10.0] * 299
    times[50] = 90.0  # in the first block: not listed
    times[150], times[250] = 30.0, 20.0
    report = block_report(times, [150], window=4, block=100, prepare_at=[149])
    assert [(e['index'], e['kind']) for e in report['slowest'][:2]] == [
        (150, 'rollover'), (250, 'frame')]
    assert report['slowest'][0]['ms'] == pytest.approx(30.0) and len(report['slowest']) == 5


# Live replay at 10 Hz (100 ms period); 20 ms frames never wait for one another.
def test_a_stall_of_five_and_a_half_periods_drops_four_frames_with_a_queue_of_one():
    # Arrivals at 100..500 ms come during the 550 ms frame: the first waits, each later one
    # replaces it (4 dropped); the one of 500 ms runs at 550 ms, done by 570 ms < 600 ms.
    times = [20.0] * 10 + [550.0] + [20.0] * 10
    assert live_drops(times, 10.0, 1) == 4
    # Two held: the arrivals of 100 and 200 ms wait, 300/400/500 ms push out the oldest (3).
    assert live_drops(times, 10.0, 2) == 3
    assert live_drops([20.0] * 21, 10.0, 1) == 0


def test_frames_slower_than_the_camera_drop_one_in_three():
    # 150 ms frames at 10 Hz: served at 0, 100 (from 150), 200 (from 300); from then on three
    # frames arrive per two served and the one of 300 ms is pushed out at 400 ms, then one every
    # 300 ms: drops at 400, 700, ..., 4300 ms, the 30th frame served being the one of 4300 ms.
    assert live_drops([150.0] * 30, 10.0, 1) == 14


def test_live_drop_report_puts_preparation_and_rollover_calls_at_the_median():
    # Call 0: the scale phase (not replayed). A prepared run: 30 ms preparation frames are
    # hidden at 10 Hz; the rollover call at 550 ms drops 4 frames as above.
    times = [300.0] + [20.0] * 40
    times[20:25] = [30.0] * 5
    times[25] = 550.0
    report = live_drop_report(times, [25], list(range(20, 25)), 10.0, 1)
    assert report['live_drops_with_rollovers'] == 4
    assert report['live_drops_without_rollovers'] == 0
    assert report['live_hz'] == pytest.approx(10.0) and report['live_queue'] == 1


def test_live_drops_refuses_a_bad_rate_or_queue():
    with pytest.raises(ValueError, match='rate'):
        live_drops([10.0], 0.0, 1)
    with pytest.raises(ValueError, match='capacity'):
        live_drops([10.0], 30.0, 0)


def test_bench_model_reports_the_live_replay_and_the_slowest_frames():
    # The tiny model on the CPU, sessions of 6 keyframes: a few rollovers in 16 frames. At a
    # camera of one frame per 1000 s the worker is always idle when a frame comes: no drop.
    args = bench.build_parser().parse_args([
        'model', '--preset', 'tiny', '--device', 'cpu', '--height', '126', '--width', '224',
        '--frames', '16', '--warmup', '2', '--scale-frames', '2', '--window', '3',
        '--backend', 'sdpa', '--session-keyframes', '6', '--overlap-keyframes', '2',
        '--live-hz', '0.001'])
    assert args.live_queue == LIVE_CAPACITY
    result = args.run(args)
    assert result['live_hz'] == pytest.approx(0.001)
    assert result['live_drops_with_rollovers'] == 0
    assert result['live_drops_without_rollovers'] == 0
    assert result['long_run']['live_queue'] == LIVE_CAPACITY
    assert result['long_run']['rollovers'] >= 2
    slowest = result['long_run']['slowest']
    assert len(slowest) == 5 and all(1 <= e['index'] < 16 for e in slowest)
    assert [e['ms'] for e in slowest] == sorted((e['ms'] for e in slowest), reverse=True)


def test_progress_blocks_are_blocks_of_timed_calls_as_the_report_cuts_them(capsys):
    # N_s = 2: the first call is buffered and timed with the second, so 8 calls give 7 timed
    # calls: one full block of 4 (the block peaks must line up with block_report's blocks).
    config = EngineConfig.from_flat({
        'model.preset': 'tiny', 'stream.device': 'cpu', 'stream.image_width': 112,
        'cache.backend': 'sdpa', 'cache.scale_frames': 2, 'cache.sliding_window': 3})
    session = StreamingSession(config, allow_random_weights=True, seed=0)
    rng = np.random.default_rng(0)
    tensor, info = preprocess_image(rng.integers(0, 256, (64, 128, 3), dtype=np.uint8), 112, 14)
    times_ms, roles = stream_frames(session, [tensor], info, 8, torch.device('cpu'), progress=4)
    assert len(times_ms) == len(roles) == 7 and roles[0] == 'scale x2'
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('frames')]
    assert len(lines) == 1 and lines[0].startswith('frames 0..3: ')
    assert float(lines[0].split(': ')[1].split(' ms')[0]) == pytest.approx(
        np.mean(times_ms[:4]), abs=0.01)
