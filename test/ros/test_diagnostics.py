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
"""Levels and values of ros/publishers/diagnostics.py, from counters to DiagnosticStatus.

Run: ``pytest test/ros/test_diagnostics.py`` (under a second; no ROS graph).
"""

from dataclasses import replace
import time

from lingbot_map_ros.engine.session.reasons import POLICY, Reason
from lingbot_map_ros.engine.stats import CacheStats, SessionStats
from lingbot_map_ros.kernel_config import KernelConfig
from lingbot_map_ros.ros.messages.conversions import DROP_REASONS
from lingbot_map_ros.ros.publishers import diagnostics
from lingbot_map_ros.ros.publishers.diagnostics import ERROR, NodeStats, OK, STALE, WARN
import pytest

INFO = {'topic': '/cam/image', 'transport': 'raw', 'queue_mode': 'live', 'queue_length': 0}
CACHE = CacheStats(frame_count=12, scale_pages=8, live_pages=4, free_pages=1,
                   special_tokens=72, special_pages=1, free_special_pages=9, visible_tokens=900,
                   contiguous=True, page_size=70, num_patch_pages=13, num_special_pages=10,
                   max_total_frames=100, remaining_frames=88, kv_bytes=4096,
                   kv_bytes_used=2048, backend='sdpa', dtype='float32', camera_frames=12,
                   camera_bytes=1024)
SESSION = SessionStats(frames_in=12, frames_out=12, keyframes=12, time_index=12,
                       pending_frames=0, max_time_index=1024, cache=CACHE, backend='sdpa',
                       device='cpu', dtype='float32', weights='w.pt', model_preset='tiny',
                       image_size_hw=(56, 84), fast_path='eager', cuda_graphs=False,
                       compiled=False, whole_frame_graphs=False, fast_path_fallbacks=0,
                       gpu_memory_allocated_bytes=0, gpu_memory_reserved_bytes=0)
# Before the first frame: no cache, no processed size, nothing counted.
FRESH = replace(SESSION, frames_in=0, frames_out=0, keyframes=0, time_index=0, cache=None,
                image_size_hw=None)


def values(status):
    return {kv.key: kv.value for kv in status.values}


def test_input_is_stale_until_images_arrive_then_ok():
    stats = NodeStats()
    status = diagnostics.input_status('cam/lingbot_map', stats.roll(), INFO, 5.0)
    assert status.level == STALE and '/cam/image' in status.message
    assert status.name == 'cam/lingbot_map: input'
    stats.count_received()
    stats.count_received()
    status = diagnostics.input_status('n', stats.roll(), INFO, 5.0)
    assert status.level == OK
    assert values(status)['received_total'] == '2'


def test_input_goes_stale_after_silence():
    stats = NodeStats()
    stats.count_received()
    time.sleep(0.05)
    assert diagnostics.input_status('n', stats.roll(), INFO, 0.01).level == STALE


def test_drops_warn_once_per_period_except_live_overflow():
    stats = NodeStats()
    stats.count_received()
    stats.count_drop('queue_overflow', num=3)
    status = diagnostics.input_status('n', stats.roll(), INFO, 5.0)
    assert status.level == OK and values(status)['drops.queue_overflow'] == '3'
    stats.count_received()
    stats.count_drop('encoding', "unsupported encoding '32FC1'")
    status = diagnostics.input_status('n', stats.roll(), INFO, 5.0)
    assert status.level == WARN and '1 encoding' in status.message
    assert '32FC1' in values(status)['last_problem']
    stats.count_received()
    status = diagnostics.input_status('n', stats.roll(), INFO, 5.0)
    assert status.level == OK  # the next period is clean again; totals stay
    assert values(status)['drops_total'] == '4'


def test_last_problem_stays_the_latest_after_the_period_of_the_drops():
    # 284 refused frames, then clean periods: the input status keeps saying why (the level is
    # OK again), and the engine status keeps its own kind of problem apart.
    stats = NodeStats()
    stats.count_received()
    stats.count_drop('stamp_out_of_order', 'stamp 5.0 s is not newer than 6.0 s', num=284)
    assert diagnostics.input_status('n', stats.roll(), INFO, 5.0).level == WARN
    stats.count_received()
    report = stats.roll()
    status = diagnostics.input_status('n', report, INFO, 5.0)
    assert status.level == OK
    assert values(status)['last_problem'] == \
        'dropped (stamp_out_of_order): stamp 5.0 s is not newer than 6.0 s'
    assert values(diagnostics.engine_status('n', report, SESSION, 8))['last_problem'] == 'none'
    stats.count_error('RuntimeError: boom')
    stats.roll()
    report = stats.roll()
    assert values(diagnostics.engine_status('n', report, SESSION, 8))['last_problem'] == \
        'engine error: RuntimeError: boom'
    assert values(diagnostics.input_status('n', report, INFO, 5.0))['last_problem'] == \
        'dropped (stamp_out_of_order): stamp 5.0 s is not newer than 6.0 s'


def test_latency_is_the_last_period_with_frames_not_0_in_a_quiet_one():
    stats = NodeStats()
    assert values(diagnostics.engine_status('n', stats.roll(), SESSION, 8))[
        'latency_mean_ms'] == 'n/a'  # nothing published yet: unknown, not 0
    for i in range(120):
        stats.count_output(10.0 + i, 5.0)
    first = values(diagnostics.engine_status('n', stats.roll(), SESSION, 8))
    quiet = values(diagnostics.engine_status('n', stats.roll(), SESSION, 8))
    for v in (first, quiet):
        assert float(v['latency_mean_ms']) == pytest.approx(69.5, abs=1e-3)
        assert float(v['latency_max_ms']) == pytest.approx(129.0)
        assert float(v['inference_mean_ms']) == pytest.approx(5.0)
    stats.count_output(7.0, None)
    v = values(diagnostics.engine_status('n', stats.roll(), SESSION, 8))
    assert float(v['latency_mean_ms']) == pytest.approx(7.0) and v['inference_mean_ms'] == 'n/a'


def test_engine_levels_and_latency():
    stats = NodeStats()
    buffering = replace(FRESH, frames_in=2, pending_frames=2)
    assert diagnostics.engine_status('n', stats.roll(), buffering,
                                     8).message == 'buffering scale frames (2/8)'
    stats.count_output(40.0, 20.0)
    stats.count_output(60.0, 30.0)
    status = diagnostics.engine_status('n', stats.roll(), SESSION, 8)
    v = values(status)
    assert status.level == OK
    assert (v['latency_mean_ms'], v['latency_max_ms']) == ('50.000', '60.000')
    assert v['inference_max_ms'] == '30.000' and v['backend'] == 'sdpa' and 'cache' not in v
    stats.count_reset('manual')
    assert diagnostics.engine_status('n', stats.roll(), SESSION, 8).level == OK
    stats.count_reset('time_index_limit', 'time index 1024')
    status = diagnostics.engine_status('n', stats.roll(), SESSION, 8)
    assert status.level == WARN and 'time_index_limit' in status.message
    assert values(status)['resets.time_index_limit'] == '1'
    stats.count_error('RuntimeError: boom')
    status = diagnostics.engine_status('n', stats.roll(), SESSION, 8)
    assert status.level == ERROR and 'boom' in status.message


def test_cache_warns_near_its_ceilings():
    status = diagnostics.cache_status('n', CACHE, 12, 1024)
    assert status.level == OK and values(status)['frame_count'] == '12'
    full = replace(CACHE, frame_count=95)
    assert diagnostics.cache_status('n', full, 95, 1024).level == WARN
    assert diagnostics.cache_status('n', CACHE, 1000, 1024).level == WARN


def _all_statuses(stats: NodeStats, session: SessionStats) -> list:
    report = stats.roll()
    return [diagnostics.input_status('n', report, INFO, 5.0),
            diagnostics.engine_status('n', report, session, 8),
            diagnostics.cache_status('n', session.cache, session.time_index, 1024)]


def test_every_status_has_one_key_set_in_every_state():
    # A monitor keys on names: before the cache exists, while tracking, after drops, errors
    # and resets, each status must publish the same keys (unknown values explicit).
    stats = NodeStats()
    states = {'before the first frame': _all_statuses(stats, FRESH)}
    stats.count_received()
    states['buffering'] = _all_statuses(stats, replace(FRESH, frames_in=1, pending_frames=1))
    stats.count_output(40.0, 20.0)
    states['tracking'] = _all_statuses(stats, SESSION)
    stats.count_drop('encoding', "unsupported encoding '32FC1'")
    stats.count_error('RuntimeError: boom')
    stats.count_reset('engine_error', 'boom')
    states['after an error and a reset'] = _all_statuses(stats, FRESH)
    first = states['before the first frame']
    for name, statuses in states.items():
        for want, got in zip(first, statuses):
            assert [kv.key for kv in got.values] == [kv.key for kv in want.values], name
    fresh = [values(s) for s in first]
    assert fresh[2]['frame_count'] == 'n/a' and fresh[2]['time_index'] == '0'
    assert fresh[1]['image_size_hw'] == 'n/a' and fresh[1]['last_problem'] == 'none'
    assert fresh[0]['drops.encoding'] == '0' and fresh[1]['resets.manual'] == '0'
    after = [values(s) for s in states['after an error and a reset']]
    assert after[0]['drops.encoding'] == '1' and after[1]['resets.engine_error'] == '1'
    assert 'boom' in after[1]['last_problem']


def test_counter_keys_are_unchanged_and_follow_the_reason_policy():
    # The keys monitors use (docs/robustness.md), listed from the start.
    stats = NodeStats()
    input_status, engine_status, _ = _all_statuses(stats, FRESH)
    assert sorted(k for k in values(input_status) if k.startswith('drops.')) == [
        'drops.decode', 'drops.depth_encoding', 'drops.depth_no_valid_pixels',
        'drops.depth_size', 'drops.depth_stamp_future', 'drops.depth_stamp_invalid',
        'drops.depth_stamp_stale', 'drops.depth_unpaired',
        'drops.encoding', 'drops.invalid_frame', 'drops.queue_overflow',
        'drops.resolution_mismatch', 'drops.size', 'drops.stamp_invalid',
        'drops.stamp_jump_ahead', 'drops.stamp_out_of_order', 'drops.step', 'drops.truncated']
    assert sorted(k for k in values(engine_status) if k.startswith('resets.')) == [
        'resets.cache_full', 'resets.clock_jump', 'resets.engine_error', 'resets.manual',
        'resets.nan_pose', 'resets.resolution_changed', 'resets.session_limit',
        'resets.time_index_limit']
    # Every reason the image checks give is a drop reason of the table.
    assert all(not POLICY[Reason(r)].resets and POLICY[Reason(r)].node for r in DROP_REASONS)
    # Counting takes the enum or its value alike; unknown reasons are refused.
    stats.count_drop(Reason.STAMP_JUMP_AHEAD, 'ahead')
    stats.count_drop('stamp_jump_ahead', 'ahead again')
    stats.count_reset(Reason.MANUAL)
    report = stats.roll()
    assert report.drops == {'stamp_jump_ahead': 2} and report.resets == {'manual': 1}
    assert report.last_problem == 'dropped (stamp_jump_ahead): ahead again'  # manual: no problem
    with pytest.raises(ValueError):
        stats.count_drop('no_such_reason')


def test_fast_path_fallbacks_are_counted_by_name_in_every_state():
    # Every step-down kind of the fast path is its own key, 0 included, before the first
    # frame as while tracking; the total and the reason ride along.
    stats = NodeStats()
    fresh = values(diagnostics.engine_status('n', stats.roll(), FRESH, 8))
    assert sorted(k for k in fresh if k.startswith('fallbacks.')) == [
        'fallbacks.attention_kernel', 'fallbacks.backend_refused', 'fallbacks.camera_head',
        'fallbacks.capture', 'fallbacks.compile', 'fallbacks.depth_head',
        'fallbacks.dino_trunk', 'fallbacks.whole_frame']
    assert fresh['fallbacks.capture'] == '0' and 'fallbacks' not in fresh
    stepped = replace(SESSION, fast_path_requested='whole_frame', fast_path='eager',
                      fast_path_fallbacks=2, fast_path_reason='CUDA graphs unavailable',
                      fallbacks={'capture': 1, 'attention_kernel': 1})
    tracking = values(diagnostics.engine_status('n', stats.roll(), stepped, 8))
    assert list(tracking) == list(fresh)
    assert (tracking['fallbacks.capture'], tracking['fallbacks.attention_kernel'],
            tracking['fallbacks.compile']) == ('1', '1', '0')
    assert tracking['fast_path_requested'] == 'whole_frame'
    assert tracking['fast_path_reason'] == 'CUDA graphs unavailable'


def test_cache_status_shows_the_precision_and_says_when_it_is_outside_the_gate():
    status = diagnostics.cache_status('n', CACHE, 12, 1024)
    assert values(status)['precision'] == 'faithful' and 'fidelity gate' not in status.message
    fast = diagnostics.cache_status('n', replace(CACHE, precision='fast_approximate'), 12, 1024)
    assert values(fast)['precision'] == 'fast_approximate'
    assert 'fast_approximate: outside the fidelity gate' in fast.message


def test_cache_status_shows_the_kernel_config_and_names_the_tuned_fields():
    defaults = KernelConfig().summary()
    status = diagnostics.cache_status('n', replace(CACHE, kernel=defaults), 12, 1024)
    assert values(status)['kernel'] == defaults and 'cache.kernel' not in status.message
    assert 'triton_block_m=128' in defaults and 'lanes=true' in defaults
    tuned = KernelConfig(triton_splits=4, staged_runs=False).summary()
    status = diagnostics.cache_status('n', replace(CACHE, kernel=tuned), 12, 1024)
    assert values(status)['kernel'] == tuned
    assert status.message.endswith('; cache.kernel tuned: triton_splits=4,staged_runs=false')
