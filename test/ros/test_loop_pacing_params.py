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
"""``loop.verify_unit_interval``: its validation, its ROS parameter and the node's feed wiring.

The pacing itself (``FramePace``, a check beside live frames) is checked in
``test/engine/loop/test_verify_pacing.py``, which needs no ROS.
"""

from __future__ import annotations

from types import SimpleNamespace

from lingbot_map_ros.config import LoopConfig, section_from_flat
from lingbot_map_ros.ros.inference.loop_feed import LoopFeed
from lingbot_map_ros.ros.parameters.params import loop_specs
import pytest
import rclpy.logging


def test_the_parameter_defaults_to_3_and_refuses_0_and_negatives():
    assert LoopConfig().verify_unit_interval == 3
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f'loop.verify_unit_interval={bad} must be >= 1'):
            LoopConfig(verify_unit_interval=bad)
    with pytest.raises(ValueError, match='loop.verify_unit_interval=2.5 must be an integer'):
        LoopConfig(verify_unit_interval=2.5)
    with pytest.raises(ValueError, match='loop.verify_unit_interval'):
        section_from_flat(LoopConfig, 'loop', {'loop.verify_unit_interval': 0})
    assert section_from_flat(LoopConfig, 'loop',
                             {'loop.verify_unit_interval': 4}).verify_unit_interval == 4
    spec = {s.name: s for s in loop_specs()}['loop.verify_unit_interval']
    assert spec.default == 3 and spec.int_range[0] == 1 and spec.read_only


def test_the_feed_paces_its_verifier_by_the_parameter():
    values = {s.name: s.default for s in loop_specs()}
    values['loop.verify_unit_interval'] = 3
    # The feed reads only these of the node's session at start (no engine: no pool to size).
    session = SimpleNamespace(session=SimpleNamespace(place_descriptors=False))
    feed = LoopFeed(session, values, rclpy.logging.get_logger('test_verify_pacing'))
    assert feed.backend.frame_pace.every_n_frames == 3
    frame = SimpleNamespace(is_keyframe=False)
    feed.feed(frame)
    assert feed.backend.frame_pace.frames == 1 and feed.backend.frame_pace.pending
    feed.pace()  # the worker's first unit: due, no wait
    for expected in (1, 2, 3):
        assert not feed.backend.frame_pace.pending
        feed.feed(frame)  # never waits for the verifier
        assert feed.backend.frame_pace.frames == 1 + expected
    assert feed.backend.frame_pace.pending
    feed.close()
    with pytest.raises(ValueError, match='loop.verify_unit_interval=0'):
        LoopFeed(session, {**values, 'loop.verify_unit_interval': 0},
                 rclpy.logging.get_logger('test_verify_pacing'))
