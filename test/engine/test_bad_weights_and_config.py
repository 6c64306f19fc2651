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
"""Start-up refusals that must name the problem in one line: odd weights paths, bad config."""

import os

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.errors import WeightsError
from lingbot_map_ros.engine.model.weights import load_checkpoint
import pytest


def test_a_directory_as_weights_is_named_as_such(tmp_path):
    folder = tmp_path / 'weights.pt'
    folder.mkdir()
    with pytest.raises(WeightsError, match='is a directory; give the checkpoint file in it'):
        load_checkpoint(folder)


@pytest.mark.skipif(not os.path.exists('/dev/zero'), reason='no /dev/zero')
def test_a_device_as_weights_is_not_read():
    with pytest.raises(WeightsError, match='not a regular file'):
        load_checkpoint('/dev/zero')


def test_random_bytes_get_a_short_message(tmp_path):
    path = tmp_path / 'random.pt'
    path.write_bytes(b'\x01' + os.urandom(4096))  # neither zip (PK) nor pickle (0x80)
    with pytest.raises(WeightsError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert 'not a torch checkpoint' in message and '\n' not in message and len(message) < 300


def test_a_damaged_zip_checkpoint_gives_one_line(tmp_path):
    path = tmp_path / 'cut.pt'
    path.write_bytes(b'PK\x03\x04' + os.urandom(2000))
    with pytest.raises(WeightsError) as info:
        load_checkpoint(path)
    assert '\n' not in str(info.value) and 'cannot load torch checkpoint' in str(info.value)


@pytest.mark.parametrize('max_frame_num', [2, 8])
def test_max_frame_num_must_leave_room_after_the_scale_frames(max_frame_num):
    with pytest.raises(ValueError, match='must be larger than cache.scale_frames=8'):
        EngineConfig.from_flat({'model.max_frame_num': max_frame_num, 'cache.scale_frames': 8})
    # The smallest table that works: a session of 9 keyframes rolling over on 8.
    assert EngineConfig.from_flat({'model.max_frame_num': 9, 'cache.scale_frames': 8,
                                   'stream.session_keyframes': 9,
                                   'stream.overlap_keyframes': 8}).model.max_frame_num == 9
