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
"""Helpers for node tests: one rclpy context, a spinning executor and a probe node.

The probe publishes images and records everything the node under test publishes, with the
arrival order kept, so tests can assert on values (stamps, frame ids, diagnostics key/values).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable

import cv2
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry, Path
import numpy as np
import pytest
from rcl_interfaces.msg import Log
from rcl_interfaces.srv import SetParameters
import rclpy
from rclpy.exceptions import InvalidHandle
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, PointCloud2
from std_srvs.srv import Trigger

_counter = itertools.count()

# The tiny random-weight engine on CPU, small images: a few frames per second on 2 cores.
TINY_CPU = {
    'model.preset': 'tiny',
    'stream.device': 'cpu',
    'stream.dtype': 'float32',
    'stream.image_width': 112,
    'cache.backend': 'sdpa',
    'cache.scale_frames': 3,
    'cache.sliding_window': 4,
    'allow_random_weights': True,
    'diagnostics.period_s': 0.25,
}


def make_image(index: int, height: int = 60, width: int = 80) -> np.ndarray:
    """Return a textured RGB frame that shifts with ``index`` (deterministic)."""
    rng = np.random.default_rng(7)
    base = rng.integers(0, 255, (height, width * 2, 3), dtype=np.uint8)
    base = cv2.GaussianBlur(base, (5, 5), 0)
    return np.ascontiguousarray(base[:, index % width:index % width + width])


def image_msg(rgb: np.ndarray, stamp_ns: int, frame_id: str = 'cam_optical') -> Image:
    """Build an rgb8 ``sensor_msgs/Image``."""
    msg = Image(height=rgb.shape[0], width=rgb.shape[1], encoding='rgb8', is_bigendian=0,
                step=rgb.shape[1] * 3)
    msg.header.frame_id = frame_id
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    msg.data = rgb.tobytes()
    return msg


def jpeg_msg(rgb: np.ndarray, stamp_ns: int, frame_id: str = 'cam_optical') -> CompressedImage:
    """Build a JPEG ``sensor_msgs/CompressedImage``."""
    ok, data = cv2.imencode('.jpg', cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    msg = CompressedImage(format='rgb8; jpeg compressed bgr8')
    msg.header.frame_id = frame_id
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    msg.data = data.tobytes()
    return msg


SEC = 1_000_000_000
TIMEOUT_S = 60.0
"""Generous waits: two CPU cores are shared with other jobs."""


@pytest.fixture(autouse=True)
def no_callback_errors(graph: Any):
    """Fail a test whose callbacks raised into the executor (the node must never do that).

    Autouse in every module that imports it.
    """
    yield
    errors, graph.errors[:] = list(graph.errors), []
    assert not errors, [f'{type(e).__name__}: {e}' for e in errors]


def bag(**overrides: Any) -> dict[str, Any]:
    """Return overrides for bag mode: every frame processed, in order (deterministic tests)."""
    return {'input__queue_mode': 'bag', 'input__qos__reliability': 'reliable',
            'input__qos__depth': 100, **overrides}


def publish(probe: 'Probe', msgs: list[Any]) -> None:
    """Publish image messages on the probe's image topic, in order."""
    for msg in msgs:
        probe.image_pub.publish(msg)


def wait_poses(probe: 'Probe', num: int) -> Any:
    """Wait until the probe holds at least ``num`` poses."""
    return wait_for(lambda: probe.count(probe.poses) >= num, TIMEOUT_S,
                    f'{num} poses (have {probe.count(probe.poses)})')


def wait_status(probe: 'Probe', node: Node, task: str, predicate: Callable[..., Any],
                what: str, timeout_s: float = TIMEOUT_S) -> Any:
    """Wait for a diagnostics status of ``node`` satisfying ``predicate(level, msg, values)``."""
    def check():
        status = probe.status(node.get_fully_qualified_name(), task)
        return status if status and predicate(*status) else None
    return wait_for(check, timeout_s, what)


def stamps(start_s: float, num: int, step_s: float = 0.1) -> list[int]:
    """Return ``num`` stamps in nanoseconds from ``start_s``, ``step_s`` apart."""
    return [int((start_s + i * step_s) * SEC) for i in range(num)]


def stamp_ns(msg: Any) -> int:
    """Nanoseconds of a message header stamp."""
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``condition`` until it is truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f'timed out after {timeout_s} s waiting for {what}')


class Probe(Node):
    """Publishes input images to a node under test and records its outputs."""

    def __init__(self, context: Any, namespace: str, compressed: bool = False) -> None:
        """Create publishers and subscriptions in ``namespace``."""
        super().__init__(f'probe_{next(_counter)}', namespace=namespace, context=context)
        reliable = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
        self.image_pub = self.create_publisher(
            CompressedImage if compressed else Image,
            'image/compressed' if compressed else 'image', reliable)
        self.raw_pub = self.image_pub if not compressed else None
        self.lock = threading.Lock()
        self.poses: list[PoseStamped] = []
        self.odometry: list[Odometry] = []
        self.paths: list[Path] = []
        self.clouds: list[PointCloud2] = []
        self.depths: list[Image] = []
        self.diagnostics: list[DiagnosticArray] = []
        prefix = 'lingbot_map/'
        outputs = ((PoseStamped, 'pose', self.poses), (Odometry, 'odometry', self.odometry),
                   (Path, 'path', self.paths), (PointCloud2, 'cloud', self.clouds),
                   (Image, 'depth/image', self.depths))
        self.subs = [self.create_subscription(msg_type, prefix + topic, self._recorder(store),
                                              reliable)
                     for msg_type, topic, store in outputs]
        self.create_subscription(DiagnosticArray, '/diagnostics',
                                 self._recorder(self.diagnostics), reliable)
        self.reset_client = self.create_client(Trigger, prefix + 'reset')
        self.param_client = self.create_client(SetParameters, prefix + 'set_parameters')

    def wait_matched(self, node: Node, timeout_s: float = 30.0) -> None:
        """Wait until images reach ``node`` and its outputs reach us, both ways matched.

        A publisher can see a subscription before that subscription has matched the publisher;
        frames sent in between are lost, so both ends are checked.
        """
        image_subs = [s for s in node.subscriptions if s.topic_name.endswith(
            self.image_pub.topic_name.rsplit('/', 1)[-1])]
        wait_for(lambda: self.image_pub.get_subscription_count() > 0 and
                 all(s.get_publisher_count() > 0 for s in image_subs) and
                 all(s.get_publisher_count() > 0 for s in self.subs[:3]),
                 timeout_s, 'publisher/subscription matching')

    def _recorder(self, store: list) -> Callable[[Any], None]:
        def record(msg: Any) -> None:
            with self.lock:
                store.append(msg)
        return record

    def count(self, store: list) -> int:
        """Thread-safe length of a record list."""
        with self.lock:
            return len(store)

    def call(self, client: Any, request: Any, timeout_s: float = 30.0) -> Any:
        """Call a service from the test thread and wait for the response."""
        wait_for(lambda: client.wait_for_service(timeout_sec=0.1), timeout_s,
                 f'service {client.srv_name}')
        future = client.call_async(request)
        wait_for(future.done, timeout_s, f'response of {client.srv_name}')
        return future.result()

    def set_params(self, **values: Any) -> list[Any]:
        """Set parameters of the node under test through its service; return the results."""
        request = SetParameters.Request()
        request.parameters = [Parameter(k.replace('__', '.'), value=v).to_parameter_msg()
                              for k, v in values.items()]
        return list(self.call(self.param_client, request).results)

    def status(self, node_fqn: str, task: str) -> tuple[bytes, str, dict[str, str]] | None:
        """Latest diagnostics status ``<node>: <task>`` as (level, message, values)."""
        name = f'{node_fqn.lstrip("/")}: {task}'
        with self.lock:
            arrays = list(self.diagnostics)
        for array in reversed(arrays):
            for status in array.status:
                if status.name == name:
                    return status.level, status.message, {kv.key: kv.value
                                                          for kv in status.values}
        return None


class Graph:
    """An rclpy context with a multi-threaded executor spinning in a background thread."""

    def __init__(self) -> None:
        """Initialise rclpy in a private context and start spinning."""
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.executor = MultiThreadedExecutor(num_threads=4, context=self.context)
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._nodes: list[Node] = []
        self._thread.start()

    def _spin(self) -> None:
        # Keep spinning through callback exceptions, so one bad callback cannot silently stop
        # every later test; the exceptions are kept for the tests to check.
        while self.context.ok():
            try:
                self.executor.spin_once(timeout_sec=0.1)
            except InvalidHandle:
                # rclpy raises this in the executor when a node is destroyed while a spin
                # thread still holds one of its handles (test teardown), not a node fault.
                pass
            except Exception as exc:  # noqa: BLE001
                if self.context.ok():
                    self.errors.append(exc)

    def start_node(self, namespace: str, values: dict[str, Any],
                   compressed: bool = False) -> tuple[Node, Probe]:
        """Start ``lingbot_map_node`` with ``values`` and a probe in ``namespace``, matched."""
        from lingbot_map_ros.ros.nodes.node import LingbotMapNode

        node = self.add(LingbotMapNode(
            context=self.context, namespace=namespace,
            parameter_overrides=[Parameter(k, value=v) for k, v in values.items()]))
        probe = self.add(Probe(self.context, namespace, compressed=compressed))
        probe.wait_matched(node)
        return node, probe

    def add(self, node: Node) -> Node:
        """Spin ``node`` until :meth:`close`."""
        self._nodes.append(node)
        self.executor.add_node(node)
        return node

    def remove(self, node: Node) -> None:
        """Stop spinning and destroy ``node``."""
        self.executor.remove_node(node)
        self._nodes.remove(node)
        time.sleep(0.1)  # let callbacks already taken by spin threads finish
        node.destroy_node()

    def close(self) -> None:
        """Destroy every node and shut the context down."""
        for node in list(self._nodes):
            self.remove(node)
        self.executor.shutdown(timeout_sec=5.0)
        rclpy.shutdown(context=self.context)
        self._thread.join(5.0)


class Rosout:
    """Every /rosout message of one logger name (a node's, as /rosout names it), kept in order."""

    def __init__(self, graph, name: str) -> None:
        self.node = graph.add(Node(f'rosout_probe_{next(_counter)}', context=graph.context))
        self.lock = threading.Lock()
        self.lines: list[tuple[int, str]] = []
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)

        def keep(msg: Log) -> None:
            if msg.name.endswith(name):
                with self.lock:
                    self.lines.append((msg.level, msg.msg))
        self.sub = self.node.create_subscription(Log, '/rosout', keep, qos)

    def find(self, level: int, text: str) -> list[str]:
        with self.lock:
            return [m for lv, m in self.lines if lv == level and text in m]
