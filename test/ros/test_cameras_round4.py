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
"""Several cameras on the real rclpy graph with the tiny model (issue #36).

The fused ``~/pose``, ``~/odometry`` and TF ``odom -> base_link`` only go forward in stamp, and
the primary camera's image size is the engine's (a side camera sending first never locks the
primary out).

The switches of the odometry source are driven without timing luck: the test hands the node's
camera group its frames itself, each with an explicit reception time (the rig's clock), so a
camera is stale exactly when the test says so. The three patterns of the issue: the primary
back after a pause with the other camera's frame at the same stamp posed first; the primary
back inside a synchronised group listed after the other camera (``[left, front]``); the
primary back with stamps older than the other camera's last.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry
from node_harness import image_msg, make_image, stamp_ns, TINY_CPU, wait_for
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy

try:  # TF is broadcast only where tf2_ros is installed (a ROS install, not the PyPI wheels)
    from tf2_msgs.msg import TFMessage
except ImportError:  # pragma: no cover - depends on the machine
    TFMessage = None

_ns = itertools.count()
_STAMP0 = 50 * 1_000_000_000
_PERIOD_NS = 100_000_000
_TIMEOUT_S = 240.0


class FusedProbe(Node):
    """Records the fused pose, odometry, ``odom -> base_link`` and the cameras status."""

    def __init__(self, context: Any, namespace: str) -> None:
        """Subscribe the fused outputs, /tf and /diagnostics."""
        super().__init__(f'fused_probe_{next(_ns)}', namespace=namespace, context=context)
        qos = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)
        self.lock = threading.Lock()
        self.records: dict[str, list] = {'pose': [], 'odometry': [], 'tf': [], 'diag': []}
        self.subs = [
            self.create_subscription(PoseStamped, 'lingbot_map/pose',
                                     lambda m: self._keep('pose', stamp_ns(m)), qos),
            self.create_subscription(Odometry, 'lingbot_map/odometry',
                                     lambda m: self._keep('odometry', stamp_ns(m)), qos),
            self.create_subscription(DiagnosticArray, '/diagnostics',
                                     lambda m: self._keep('diag', m), qos)]
        if TFMessage is not None:
            self.subs.append(self.create_subscription(TFMessage, '/tf', self._tf, qos))
        self.namespace = namespace

    def _keep(self, key: str, value: Any) -> None:
        with self.lock:
            self.records[key].append(value)

    def _tf(self, msg: TFMessage) -> None:
        for t in msg.transforms:
            if t.header.frame_id == 'odom' and t.child_frame_id == 'base_link':
                self._keep('tf', stamp_ns(t))

    def stamps(self, key: str) -> list[int]:
        """Return what was recorded under ``key``, in arrival order."""
        with self.lock:
            return list(self.records[key])

    def cameras_status(self, fqn: str) -> dict[str, str] | None:
        """Return the latest ``<node>: cameras`` status values."""
        for array in reversed(self.stamps('diag')):
            for status in array.status:
                if status.name == f'{fqn}: cameras':
                    return {kv.key: kv.value for kv in status.values}
        return None


def _stamp(index: int) -> int:
    return _STAMP0 + index * _PERIOD_NS


def _frame(camera: str, index: int, received_s: float) -> Any:
    from lingbot_map_ros.ros.inference.session_runner import InputFrame

    offset = 0 if camera == 'front' else 20
    msg = image_msg(make_image(index + offset), _stamp(index), f'{camera}_optical')
    return InputFrame(msg, False, received_s, camera)


def _increasing(stamps: list[int]) -> bool:
    return all(b > a for a, b in zip(stamps, stamps[1:]))


def test_fused_stamps_strictly_increase_under_every_switch_pattern(graph):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    namespace = f'/fused{next(_ns)}'
    values = {**TINY_CPU, 'input.cameras': ['left', 'front'], 'input.primary_camera': 'front',
              'input.forward_jump_s': 0.0, 'diagnostics.stale_after_s': 0.95}
    node = graph.add(LingbotMapNode(
        context=graph.context, namespace=namespace,
        parameter_overrides=[Parameter(k, value=v) for k, v in values.items()]))
    probe = graph.add(FusedProbe(graph.context, namespace))
    wait_for(lambda: all(s.get_publisher_count() > 0 for s in probe.subs[:2]), 30.0,
             'matching')
    cameras = node.core.pipeline.cameras

    def group(index: int, *names: str) -> None:
        cameras.handle_group([_frame(n, index, index * 0.1) for n in names])

    for i in range(5):  # both cameras; each group listed other camera first
        group(i, 'left', 'front')
    for i in range(5, 21):  # front pauses: left is the source from 1.4 s on
        group(i, 'left')
    group(21, 'left')  # (1) left's frame at t first, then front's, back, at the same t
    group(21, 'front')
    for i in range(22, 26):
        group(i, 'left', 'front')
    for i in range(26, 38):  # front pauses again
        group(i, 'left')
    group(38, 'left', 'front')  # (2) front back inside a group listed after left
    for i in range(39, 53):
        group(i, 'left')
    for i in (45, 47, 53, 54):  # (3) front back with stamps older than left's last (52)
        cameras.handle_group([_frame('front', i, 5.3 + i * 0.001)])

    keys = ('pose', 'odometry') + (('tf',) if TFMessage is not None else ())
    for key in keys:
        wait_for(lambda k=key: _stamp(54) in probe.stamps(k), _TIMEOUT_S, f'the last {key}')
    # Stale after 0.95 s: left takes over at its frames 14, 35 and 48 (1 s after front's last).
    expected = [_stamp(i) for i in [*range(0, 5), *range(14, 22), *range(22, 26),
                                    *range(35, 39), *range(48, 53), 53, 54]]
    for key in keys:
        got = probe.stamps(key)
        assert _increasing(got), key
        assert got == expected, key
    assert cameras.rig.not_newer == 3  # front's 21, 45 and 47
    fqn = node.get_fully_qualified_name().lstrip('/')
    status = wait_for(lambda: (s := probe.cameras_status(fqn)) and
                      s.get('fused_not_newer') == '3' and s, 30.0, 'the cameras status')
    assert status['source'] == 'front' and status['primary'] == 'front'
    graph.remove(probe)
    graph.remove(node)


class CameraProbe(FusedProbe):
    """Also records each camera's own poses."""

    def __init__(self, context: Any, namespace: str, names: list[str]) -> None:
        """Subscribe ``~/<name>/pose`` of every camera besides the fused outputs."""
        super().__init__(context, namespace)
        qos = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)
        for name in names:
            self.records[name] = []
            self.subs.append(self.create_subscription(
                PoseStamped, f'lingbot_map/{name}/pose',
                lambda m, n=name: self._keep(n, stamp_ns(m)), qos))

    def status(self, fqn: str, task: str) -> dict[str, str] | None:
        """Return the latest ``<fqn>: <task>`` status values."""
        for array in reversed(self.stamps('diag')):
            for status in array.status:
                if status.name == f'{fqn}: {task}':
                    return {kv.key: kv.value for kv in status.values}
        return None


def _sized(camera: str, index: int, height: int) -> Any:
    from lingbot_map_ros.ros.inference.session_runner import InputFrame

    msg = image_msg(make_image(index, height=height), _stamp(index), f'{camera}_optical')
    return InputFrame(msg, False, index * 0.1, camera)


def test_the_primary_sets_the_size_a_side_camera_sending_first_never_locks_it_out(graph):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    namespace = f'/sizes{next(_ns)}'
    values = {**TINY_CPU, 'input.cameras': ['front', 'left'], 'input.forward_jump_s': 0.0}
    node = graph.add(LingbotMapNode(
        context=graph.context, namespace=namespace,
        parameter_overrides=[Parameter(k, value=v) for k, v in values.items()]))
    probe = graph.add(CameraProbe(graph.context, namespace, ['front', 'left']))
    wait_for(lambda: all(s.get_publisher_count() > 0 for s in probe.subs), 30.0, 'matching')
    cameras = node.core.pipeline.cameras
    for i in range(5):  # left (2:1, processed 112x56) first: it starts the engine
        cameras.handle_group([_sized('left', i, 40)])
    for i in range(5, 8):  # front (4:3, processed 112x84), the primary: left is reset
        cameras.handle_group([_sized('front', i, 60)])
    for i in range(8, 12):  # both: left's frames are refused, front's posed
        cameras.handle_group([_sized('left', i, 40), _sized('front', i, 60)])
    wait_for(lambda: _stamp(11) in probe.stamps('front'), _TIMEOUT_S, "front's last pose")
    assert probe.stamps('front') == [_stamp(i) for i in range(5, 12)]  # e67d60d: none
    assert probe.stamps('pose') == [_stamp(i) for i in range(5, 12)]
    assert probe.stamps('left') == [_stamp(i) for i in range(5)]
    assert cameras.sizes.engine_hw == (84, 112)
    fqn = node.get_fully_qualified_name().lstrip('/')
    left = wait_for(lambda: (s := probe.status(f'{fqn}/left', 'input')) and
                    s.get('drops.resolution_mismatch') == '4' and s, 30.0, 'left drops')
    assert left['drops_total'] == '4'
    engine = probe.status(f'{fqn}/left', 'engine')
    assert engine is not None and engine.get('resets.resolution_changed') == '1', engine
    graph.remove(probe)
    graph.remove(node)
