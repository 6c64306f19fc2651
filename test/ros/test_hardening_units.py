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
"""Issue 22 checks that need no graph (the node-level ones: test_hardening_node.py).

Mounting messages, the pose log's cap, TUM stamps, the cache status near capacity with
rollovers, the size check before the data, output paths.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lingbot_map_ros.engine.stats import CacheStats
from lingbot_map_ros.ros.messages.conversions import check_image_msg, ImageConversionError
from lingbot_map_ros.ros.publishers import diagnostics
from lingbot_map_ros.ros.publishers.map_output import PoseLog
from lingbot_map_ros.ros.publishers.map_save import resolve_directory
from lingbot_map_ros.ros.publishers.odom_frames import pose7_to_matrix
from lingbot_map_ros.tools import trajectory
import numpy as np
import pytest
from sensor_msgs.msg import Image

CACHE = CacheStats(frame_count=300, scale_pages=8, live_pages=64, free_pages=1,
                   special_tokens=1800, special_pages=2, free_special_pages=0,
                   visible_tokens=900, contiguous=True, page_size=70, num_patch_pages=73,
                   num_special_pages=2, max_total_frames=320, remaining_frames=20,
                   kv_bytes=4096, kv_bytes_used=2048, backend='sdpa', dtype='float32',
                   camera_frames=300, camera_bytes=1024)


@pytest.mark.parametrize('values,match', [
    ([float('inf'), 0, 0, 0, 0, 0, 1], r'src needs 7 finite numbers .*\[inf, 0, 0'),
    ([1e308, 0, 0, 0, 0, 0, 1], r'src: the camera is 1e\+308 m from the base frame'),
    ([0, 0, 0, 1e300, 1e300, 0, 0], r'\(1e\+300, 1e\+300, 0\.0, 0\.0\) has norm 1\.414e\+300'),
    ([0, 0, 0, 0, 0, 0, 0], r'\(0\.0, 0\.0, 0\.0, 0\.0\) has norm 0'),
    ([0, 0, 0, 1], r'src needs 7 finite numbers .*got \[0, 0, 0, 1\]'),
])
def test_a_bad_mounting_is_refused_with_its_source_and_real_values(values, match):
    with pytest.raises(ValueError, match=match):
        pose7_to_matrix(values, source='src')


def test_a_plausible_mounting_is_normalised():
    mount = pose7_to_matrix([999.0, 0, 0, 0, 0, 0, 3.0])  # 999 m and a quaternion of norm 3
    np.testing.assert_allclose(mount[:3, :3], np.eye(3), atol=1e-15)
    assert mount[0, 3] == 999.0  # copied: exact


def test_the_pose_log_keeps_the_newest_within_its_cap_and_counts_the_rest():
    log = PoseLog()
    pose = np.eye(4)
    fell = []
    for i in range(600):
        pose[0, 3] = i
        fell.append(log.append(i, pose, cap=300))
    stamps, c2w = log.arrays()
    assert stamps.tolist() == list(range(300, 600)) and log.dropped == 300
    assert c2w[:, 0, 3].tolist() == [float(i) for i in range(300, 600)]  # copied: exact
    assert sum(fell) == 300 and fell[:300] == [0] * 300
    assert log.capacity == 300  # grown by doubling, never past the cap
    # A smaller cap at run time: the oldest fall out at the next pose.
    assert log.append(600, pose, cap=10) == 291
    assert log.arrays()[0].tolist() == list(range(591, 601))
    log.clear()
    assert log.arrays()[0].size == 0 and log.dropped == 0 and log.capacity == 256


@pytest.mark.parametrize('stamp_ns,text', [(-4_900_000_000, '-4.900000000'),
                                           (-1, '-0.000000001'), (-500_000_000, '-0.500000000'),
                                           (0, '0.000000000'), (12_000_000_005, '12.000000005')])
def test_tum_stamps_are_exact_with_their_sign(tmp_path: Path, stamp_ns, text):
    assert trajectory.format_stamp(stamp_ns) == text
    path = tmp_path / 't.tum'
    trajectory.write_tum(path, trajectory.Trajectory(np.array([stamp_ns]), np.eye(4)[None]),
                         comments=['two\nlines'])
    lines = path.read_text().splitlines()
    assert lines[0] == '# two lines' and lines[-1].startswith(text + ' ')
    assert trajectory.read_tum(path).stamps_ns.tolist() == [stamp_ns]


def test_near_capacity_the_cache_status_says_a_rollover_comes():
    with_rollover = diagnostics.cache_status('n', CACHE, 300, 1024, rollover_keyframes=320)
    values = {kv.key: kv.value for kv in with_rollover.values}
    assert with_rollover.level == diagnostics.OK and values['next_at_capacity'] == 'rollover'
    assert 'rollover' in with_rollover.message and 'reset' not in with_rollover.message.replace(
        'no reset', '')
    without = diagnostics.cache_status('n', CACHE, 300, 1024)
    assert without.level == diagnostics.WARN and 'resets when full' in without.message
    assert {kv.key: kv.value for kv in without.values}['next_at_capacity'] == 'reset'
    # A rollover past a ceiling does not come first: WARN.
    late = diagnostics.cache_status('n', replace(CACHE, max_total_frames=310), 300, 1024,
                                    rollover_keyframes=320)
    assert late.level == diagnostics.WARN


def test_an_oversized_image_is_refused_before_its_data_is_read():
    huge = Image(height=6000, width=8000, encoding='rgb8', step=24000)  # no data at all
    with pytest.raises(ImageConversionError) as err:
        check_image_msg(huge)
    assert err.value.reason == 'size'  # not 'truncated': the data was never looked at
    ok = Image(height=2, width=2, encoding='rgb8', step=6, data=bytes(range(12)))
    view = check_image_msg(ok)
    assert np.shares_memory(view, np.frombuffer(memoryview(ok.data), np.uint8))  # no copy


def test_output_directories_resolve_to_absolute_paths(monkeypatch, tmp_path):
    monkeypatch.setenv('LINGBOT_TEST_OUT', str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert resolve_directory('$LINGBOT_TEST_OUT/maps') == tmp_path / 'maps'
    assert resolve_directory('rel/maps') == tmp_path / 'rel' / 'maps'
    assert resolve_directory('~/x').is_absolute()
    monkeypatch.delenv('LINGBOT_TEST_OUT')
    for bad in ('', '  ', '$LINGBOT_TEST_OUT/maps', '${LINGBOT_TEST_OUT}', '~no_such_user_x/m'):
        with pytest.raises(ValueError, match='output.directory'):
            resolve_directory(bad)
