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
"""The start-up line and the no-input WARN (issue #38), on the real node and rclpy.

The node's log is read back from ``/rosout`` (transient local: a late subscriber gets it).
:class:`InputWatch` is also driven by hand with a controllable clock, so no test depends on when
a timer fires. Run: ``pytest test/ros/test_input_watch.py`` (~15 s: one tiny CPU node).
"""

from __future__ import annotations

import importlib.util
import itertools

from lingbot_map_ros.ros.nodes.input_watch import InputWatch, WatchedInput
from node_harness import no_callback_errors, Rosout, TINY_CPU, wait_for  # noqa: F401 - fixture
import pytest
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import CompressedImage, Image

pytestmark = pytest.mark.rostest
_ns = itertools.count()


def test_a_silent_remapped_input_gets_one_warning_naming_the_compressed_topic(graph):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode
    ns = f'/watch_{next(_ns)}'
    rosout = Rosout(graph, f'{ns.strip("/")}.lingbot_map')
    # The camera publishes JPEG only: the raw subscription never gets a message.
    camera = graph.add(Node(f'camera_{next(_ns)}', namespace=ns, context=graph.context))
    camera.create_publisher(CompressedImage, 'cam/image_raw/compressed', 1)
    values = {**TINY_CPU, 'diagnostics.no_input_warn_s': 0.5}
    node = graph.add(LingbotMapNode(
        context=graph.context, namespace=ns,
        cli_args=['--ros-args', '-r', 'image:=cam/image_raw'],
        parameter_overrides=[Parameter(k, value=v) for k, v in values.items()]))
    warnings = wait_for(lambda: rosout.find(30, 'no image received'), 60.0, 'the WARN')
    assert len(warnings) == 1, warnings
    text = warnings[0]
    assert f"no image received on '{ns}/cam/image_raw'" in text
    assert 'no publisher on it' in text
    assert f'{ns}/cam/image_raw/compressed [CompressedImage]' in text
    assert 'input.transport: compressed' in text
    start = rosout.find(20, 'listening on')
    assert len(start) == 1, rosout.lines
    assert f"image '{ns}/cam/image_raw', camera_info '{ns}/camera_info'" in start[0]
    assert 'metric: off (model units)' in start[0]
    assert 'backend sdpa' in start[0] and 'backend auto' not in start[0]
    assert start[0].endswith('; loop closure: off (loop.enable is false)')  # the tiny preset's
    graph.remove(node)
    assert len(rosout.find(30, 'no image received')) == 1  # once per topic


def test_the_watch_warns_once_per_silent_input_after_the_deadline(graph):
    node = graph.add(Node(f'watch_unit_{next(_ns)}', context=graph.context))
    clock = [100.0]
    counts = {'image': 0, 'depth': 0}
    inputs = [WatchedInput(label, f'/robot/{label}', lambda label=label: counts[label],
                           f'-r {label}:=TOPIC') for label in counts]
    watch = InputWatch(node, inputs, 5.0, now=lambda: clock[0])
    try:
        clock[0] = 104.9
        assert watch.check() == []  # before the deadline nothing is judged
        counts['image'] = 3
        clock[0] = 105.0
        warnings = watch.check()
        assert len(warnings) == 1
        assert warnings[0].startswith("no depth received on '/robot/depth' in 5 s")
        assert "a '/compressed' topic" not in warnings[0]
        clock[0] = 200.0
        assert watch.check() == []  # once
    finally:
        watch.destroy()


@pytest.mark.parametrize('values, expected', [
    ({'loop.enable': True}, 'loop closure: on'),
    ({'loop.enable': True, 'input.cameras': ['front', 'left']},
     'loop closure: off (several cameras)')])
def test_the_start_up_line_says_whether_loop_closure_runs(graph, values, expected):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode
    ns = f'/watch_{next(_ns)}'
    rosout = Rosout(graph, f'{ns.strip("/")}.lingbot_map')
    node = graph.add(LingbotMapNode(
        context=graph.context, namespace=ns,
        parameter_overrides=[Parameter(k, value=v) for k, v in {**TINY_CPU, **values}.items()]))
    try:
        (line,) = wait_for(lambda: rosout.find(20, 'listening on'), 60.0, 'the start-up line')
        if expected.endswith(': on') and importlib.util.find_spec('gtsam') is None:
            expected = 'loop closure: unavailable ('  # no gtsam: says so, and why
            assert f'; {expected}' in line
        else:
            assert line.endswith(f'; {expected}')
    finally:
        graph.remove(node)


def test_the_hint_never_offers_the_nodes_own_subscriptions(graph):
    # A colour input and a depth input, both silent: the depth subscription is an image topic
    # in the graph, but remapping the colour input onto it would be wrong.
    node = graph.add(Node(f'watch_own_{next(_ns)}', namespace='/own', context=graph.context))
    node.create_subscription(Image, '/own/camera/image_raw', lambda _: None, 1)
    node.create_subscription(Image, '/own/camera/depth/image_raw', lambda _: None, 1)
    other = graph.add(Node(f'other_cam_{next(_ns)}', namespace='/own', context=graph.context))
    other.create_publisher(Image, '/own/camera2/image_raw', 1)
    wait_for(lambda: any(n == '/own/camera2/image_raw'
                         for n, _ in node.get_topic_names_and_types()), 30.0, 'the camera')
    clock = [0.0]
    watch = InputWatch(node, [WatchedInput('image', '/own/camera/image_raw', lambda: 0, '')],
                       1.0, now=lambda: clock[0])
    clock[0] = 2.0
    try:
        (warning,) = watch.check()
    finally:
        watch.destroy()
    assert '/own/camera2/image_raw [Image]' in warning
    assert '/own/camera/depth/image_raw' not in warning, warning


def test_zero_turns_the_watch_off(graph):
    node = graph.add(Node(f'watch_off_{next(_ns)}', context=graph.context))
    watch = InputWatch(node, [WatchedInput('image', '/x', lambda: 0, '')], 0.0,
                       now=lambda: 1e9)
    assert watch.check() == []
