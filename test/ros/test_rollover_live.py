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
"""Rollovers of the real tiny engine (CPU) in live mode, on a real rclpy graph.

Run: ``pytest test/ros/test_rollover_live.py`` (~20 s on 2 cores; marker ``rostest``).

Frames are sent one at a time, each once the node has taken the one before (no timing in the
test): every frame must come out once, across rollovers whose next session was prepared
ahead, with nothing dropped from the live queue and the preparation shown in /diagnostics.
"""

from node_harness import image_msg, make_image, stamp_ns, wait_for
import pytest
# The node tests' helpers (test/ros/test_node.py).
from test_node import publish, stamps, start, wait_status

pytestmark = pytest.mark.rostest

_TIMEOUT_S = 60.0


def test_live_rollovers_prepared_ahead_lose_no_frame(graph):
    # N_s 3 (TINY_CPU), sessions of 14 keyframes: the next session is prepared over the
    # 3 + 4 + 1 = 8 frames before each limit (tiny preset: 4 block pairs).
    node, probe = start(graph, model__max_frame_num=14, stream__session_keyframes=14,
                        stream__overlap_keyframes=3)
    num = 44
    sent = stamps(300.0, num)
    for i, stamp in enumerate(sent):
        publish(probe, [image_msg(make_image(i), stamp)])
        if i < 2:  # scale frames: no pose yet, wait until the engine took it
            wait_status(probe, node, 'engine', lambda lvl, m, v, i=i: int(v['frames_in']) > i,
                        f'scale frame {i} taken')
        else:
            wait_for(lambda i=i: probe.count(probe.poses) >= i + 1, _TIMEOUT_S,
                     f'the pose of frame {i}')
    assert [stamp_ns(p) for p in probe.poses] == sent
    _, _, odometry = wait_status(probe, node, 'odometry',
                                 lambda lvl, m, v: int(v['rollovers']) >= 3, 'three rollovers')
    assert odometry['unprepared_switches'] == '0' and odometry['last_switch_units'] == '0'
    assert odometry['preparation'] in ('idle', 'preparing', 'ready')
    assert float(odometry['last_switch_ms']) > 0.0
    _, _, inputs = wait_status(probe, node, 'input',
                               lambda lvl, m, v: int(v['received_total']) == num,
                               'every frame received')
    assert int(inputs.get('drops.queue_overflow', '0')) == 0
    _, _, engine = wait_status(probe, node, 'engine', lambda *_: True, 'engine status')
    assert not [k for k, v in engine.items() if k.startswith('resets.') and v != '0']
    graph.remove(node)
