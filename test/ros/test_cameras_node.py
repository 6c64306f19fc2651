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
"""Several cameras in one node (``input.cameras``), on the real rclpy graph with the tiny model.

Bag mode (every frame kept): every frame of every camera gets exactly one pose on
``~/<name>/pose`` and ``~/<name>/odometry``; the primary's frames drive ``~/pose``; all cameras
are streams of one engine (one model, one page pool); diagnostics report each camera and the
pool. A camera that sends garbage or stops leaves the others untouched, and when the primary
stops the next camera continues the odometry (the jump bound itself is checked with an oracle
model in test/engine/test_camera_rig.py: random weights give no meaningful trajectory).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry
from node_harness import image_msg, make_image, stamp_ns, TINY_CPU, wait_for
import numpy as np
import pytest
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image, PointCloud2

_ns = itertools.count()
_TIMEOUT_S = 240.0
_STAMP0 = 50 * 1_000_000_000
_PERIOD_NS = 100_000_000
BAG = {**TINY_CPU, 'input.queue_mode': 'bag', 'input.qos.reliability': 'reliable',
       'input.qos.depth': 100}


class RigProbe(Node):
    """Publishes each camera's images and records the per-camera and fused outputs."""

    def __init__(self, context: Any, namespace: str, names: list[str]) -> None:
        """Create a publisher per camera and subscriptions to every output."""
        super().__init__(f'rig_probe_{next(_ns)}', namespace=namespace, context=context)
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.lock = threading.Lock()
        self.pubs = {n: self.create_publisher(Image, f'{n}/image', qos) for n in names}
        self.records: dict[str, list] = {}
        topics = [('pose', PoseStamped), ('odometry', Odometry)]
        per_camera = (('pose', PoseStamped), ('odometry', Odometry), ('cloud', PointCloud2))
        topics += [(f'{n}/{t}', m) for n in names for t, m in per_camera]
        for topic, msg_type in topics:
            store = self.records.setdefault(topic, [])
            self.create_subscription(msg_type, f'lingbot_map/{topic}',
                                     lambda msg, s=store: self._keep(s, msg), qos)
        self.diagnostics: list = []
        self.create_subscription(DiagnosticArray, '/diagnostics',
                                 lambda msg: self._keep(self.diagnostics, msg), qos)

    def _keep(self, store: list, msg: Any) -> None:
        with self.lock:
            store.append(msg)

    def stamps(self, topic: str) -> list[int]:
        """Return the stamps received on ``topic``, in order."""
        with self.lock:
            return [stamp_ns(m) for m in self.records[topic]]

    def status(self, name: str) -> dict[str, str] | None:
        """Return the key/values of the latest status called ``name``."""
        with self.lock:
            arrays = list(self.diagnostics)
        for array in reversed(arrays):
            for status in array.status:
                if status.name == name:
                    return {kv.key: kv.value for kv in status.values}
        return None

    def send(self, name: str, index: int, msg: Image | None = None) -> None:
        """Publish frame ``index`` of camera ``name`` (a shifted texture per camera)."""
        offset = 20 * sorted(self.pubs).index(name)
        self.pubs[name].publish(msg or image_msg(make_image(index + offset),
                                                 _STAMP0 + index * _PERIOD_NS, f'{name}_optical'))


def start(graph: Any, names: list[str], **values: Any) -> tuple[Node, RigProbe]:
    """Start the node with ``input.cameras = names`` and a probe, matched both ways."""
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    namespace = f'/rig{next(_ns)}'
    overrides = {**BAG, 'input.cameras': names, **values}
    node = graph.add(LingbotMapNode(
        context=graph.context, namespace=namespace,
        parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()]))
    probe = graph.add(RigProbe(graph.context, namespace, names))
    wait_for(lambda: all(p.get_subscription_count() > 0 for p in probe.pubs.values()) and
             all(s.get_publisher_count() > 0 for s in node.subscriptions
                 if s.topic_name.endswith('/image')), 30.0, 'matching')
    return node, probe


def _sent(num: int) -> list[int]:
    return [_STAMP0 + i * _PERIOD_NS for i in range(num)]


@pytest.mark.parametrize('names', [['front', 'left'], ['front', 'left', 'rear']])
def test_every_frame_of_every_camera_posed_one_engine_and_diagnostics(graph, names):
    node, probe = start(graph, names)
    num = 8
    for i in range(num):
        for name in names:
            probe.send(name, i)
    for name in names:
        wait_for(lambda n=name: len(probe.stamps(f'{n}/odometry')) >= num, _TIMEOUT_S,
                 f'{name} odometry')
    for name in names:
        assert probe.stamps(f'{name}/pose') == _sent(num)
        assert probe.stamps(f'{name}/odometry') == _sent(num)
    # The primary (the first name) drives ~/pose and ~/odometry: each of its frames once.
    assert probe.stamps('pose') == _sent(num)
    with probe.lock:
        fused, own = probe.records['pose'], probe.records['front/pose']
        left_odom = probe.records['left/odometry'][-1]
    assert all(m.header.frame_id == 'odom' for m in fused)
    assert left_odom.header.frame_id == 'odom' and left_odom.child_frame_id == 'base_link'
    for a, b in zip(fused, own):  # the primary is the odom: its aligned pose is its own
        assert a.pose.position.x == pytest.approx(b.pose.position.x, abs=1e-9)
    cameras = node.core.pipeline.cameras
    engines = {id(r.session.session.engine) for r in cameras.runners.values()}
    assert len(engines) == 1  # the weights were loaded once
    fqn = node.get_fully_qualified_name().lstrip('/')
    rig = wait_for(lambda: (s := probe.status(f'{fqn}: cameras')) and
                   all(s[f'{n}.frames'] == str(num) for n in names) and s, 30.0,
                   'the cameras status')
    assert rig['source'] == 'front' and rig['switches'] == '0'
    assert rig['pool_streams'] == str(len(names))
    # Every frame reached the model once, in a batch of cameras or alone.
    assert int(rig['batched_frames']) + int(rig['alone_frames']) == num * len(names)
    assert int(rig['batched_frames']) >= 2 * int(rig['batches'])
    for name in names[1:]:
        assert int(rig[f'{name}.matched']) == num
        assert np.isfinite(float(rig[f'{name}.scale'])) and float(rig[f'{name}.scale']) > 0
        assert float(rig[f'{name}.residual']) >= 0.0
    for name in names:
        status = probe.status(f'{fqn}/{name}: input')
        assert status is not None and status['received_total'] == str(num)
        assert probe.status(f'{fqn}/{name}: engine') is not None
    graph.remove(probe)
    graph.remove(node)


def test_three_cameras_a_garbage_camera_never_disturbs_the_others(graph):
    names = ['front', 'left', 'rear']
    node, probe = start(graph, names, **{'stream.enable_depth': True, 'publish.cloud': True,
                                         'map.voxel_size': 0.001})
    num = 6
    for i in range(num):
        probe.send('front', i)
        probe.send('left', i)
        bad = image_msg(make_image(i), _STAMP0 + i * _PERIOD_NS, 'rear_optical')
        bad.step = 1  # a row shorter than the width: refused by the converter
        probe.send('rear', i, bad)
    for name in ('front', 'left'):
        wait_for(lambda n=name: len(probe.stamps(f'{n}/pose')) >= num, _TIMEOUT_S, name)
        assert probe.stamps(f'{name}/pose') == _sent(num)
    assert probe.stamps('pose') == _sent(num)
    assert probe.stamps('rear/pose') == []
    for name in ('front', 'left'):  # each camera's cloud, in odom
        wait_for(lambda n=name: len(probe.stamps(f'{n}/cloud')) >= num, 30.0, f'{name} cloud')
        with probe.lock:
            clouds = list(probe.records[f'{name}/cloud'])
        assert [stamp_ns(c) for c in clouds] == _sent(num)
        assert {c.header.frame_id for c in clouds} == {'odom'} and clouds[-1].width > 0
    fqn = node.get_fully_qualified_name().lstrip('/')
    rear = wait_for(lambda: (s := probe.status(f'{fqn}/rear: input')) and
                    s['drops.step'] == str(num) and s, 30.0, 'rear drops')
    assert rear['received_total'] == str(num)
    front = probe.status(f'{fqn}/front: input')
    assert front['drops_total'] == '0'
    # ~/map holds the keyframes of both posing cameras.
    # Each runner's statistics snapshot is taken after its outputs are published: wait for the
    # last frame's snapshot before comparing counts.
    pipeline = node.core.pipeline

    def keyframes() -> int:
        return sum(r.session_stats().keyframes for r in pipeline.cameras.runners.values())

    wait_for(lambda: pipeline.map_output.accumulator.num_keyframes == keyframes(), 30.0,
             'map keyframes of both cameras')
    assert keyframes() > pipeline.runner.session_stats().keyframes
    graph.remove(probe)
    graph.remove(node)


@pytest.mark.slow
def test_the_next_camera_takes_over_when_the_primary_stops(graph):
    # On the wall clock (the node's monotonic receive times): slow, and kept to what the graph
    # adds. The switch itself, on explicit times, is test/engine/test_camera_rig.py's.
    names = ['front', 'left']
    # Stale after 2 s: a slow frame of a loaded CI machine (over 1 s seen) must not look like
    # a stopped camera while both still send.
    node, probe = start(graph, names, **{'diagnostics.stale_after_s': 2.0})
    both = 5
    for i in range(both):
        probe.send('front', i)
        probe.send('left', i)
    wait_for(lambda: len(probe.stamps('pose')) >= both, _TIMEOUT_S, 'the first poses')
    fqn = node.get_fully_qualified_name().lstrip('/')
    index = both
    # The front camera has stopped: left frames, one by one at ~20 Hz at most, until left
    # drives the odometry.
    deadline = time.monotonic() + 60.0
    while 'left' != (probe.status(f'{fqn}: cameras') or {}).get('source'):
        assert time.monotonic() < deadline, 'no failover'
        time.sleep(0.05)
        probe.send('left', index)
        wait_for(lambda i=index: len(probe.stamps('left/pose')) > i, _TIMEOUT_S, 'a left pose')
        index += 1
    fused = probe.stamps('pose')
    assert fused[:both] == _sent(both)
    later = [s for s in fused if s >= _STAMP0 + both * _PERIOD_NS]
    assert later and set(later) <= set(_sent(index))  # left's frames continue ~/pose
    rig = probe.status(f'{fqn}: cameras')
    assert rig['switches'] == '1' and rig['front.live'] == 'False'
    graph.remove(probe)
    graph.remove(node)


@pytest.mark.parametrize('values,message', [
    ({'input.cameras': ['front', 'front']}, 'twice'),
    ({'input.cameras': ['front', '2nd']}, 'not a valid camera name'),
    ({'input.cameras': ['front', 'map']}, "node's own topic names"),
    ({'input.cameras': ['front'], 'input.primary_camera': 'rear'}, 'is not one of'),
    ({'input.cameras': ['front'], 'frames.cameras.front.base_to_camera': [0.0] * 3},
     'frames.cameras.front.base_to_camera'),
])
def test_bad_camera_settings_are_refused_with_a_reason(graph, values, message):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    overrides = [Parameter(k, value=v) for k, v in {**TINY_CPU, **values}.items()]
    with pytest.raises(ValueError, match=message):
        LingbotMapNode(context=graph.context, namespace=f'/rig_bad{next(_ns)}',
                       parameter_overrides=overrides)


def _item(camera: str, index: int) -> Any:
    from lingbot_map_ros.ros.inference.session_runner import InputFrame

    msg = image_msg(make_image(0, 4, 4), _STAMP0 + index * _PERIOD_NS)
    return InputFrame(msg, False, 0.0, camera)


def test_live_queue_keeps_the_newest_frame_of_each_camera():
    from lingbot_map_ros.ros.inference.camera_group import CameraQueue

    queue = CameraQueue(2, capacity=64, block_when_full=False)
    assert queue.put(_item('a', 0)) == 0
    assert queue.put(_item('b', 0)) == 0
    assert queue.put(_item('a', 1)) == 1  # replaces a's waiting frame, not b's
    taken = [queue.get(0.1) for _ in range(2)]
    assert [(i.camera, stamp_ns(i.msg)) for i in taken] == [
        ('b', _STAMP0), ('a', _STAMP0 + _PERIOD_NS)]


def test_synced_frames_are_taken_in_each_cameras_order():
    from lingbot_map_ros.ros.inference.camera_group import CameraQueue

    queue = CameraQueue(3, capacity=64, block_when_full=True)
    for item in (_item('b', 0), _item('b', 1), _item('c', 5), _item('a', 1)):
        queue.put(item)
    first = queue.get(0.1)  # b at 0
    # Candidates: the oldest frame of each other camera (c at 500 ms, a at 100 ms).
    assert [i.camera for i in queue.take_synced(first, 10_000_000)] == []
    assert [i.camera for i in queue.take_synced(first, 100_000_000)] == ['a']
    assert [(i.camera, stamp_ns(i.msg)) for i in (queue.get(0.1), queue.get(0.1))] == [
        ('b', _STAMP0 + _PERIOD_NS), ('c', _STAMP0 + 5 * _PERIOD_NS)]
