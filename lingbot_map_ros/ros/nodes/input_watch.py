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
"""What the node listens to, said once at start, and a warning when an expected input stays silent.

The start-up line names every input by its resolved name (namespace and remaps applied): each
camera's image and camera_info, the depth image with ``metric.source: depth``, the metric mode,
the attention backend in use (``auto`` resolved) and whether loop closure runs. Then
:class:`InputWatch` checks, on a steady clock (a stopped ``/clock`` does not stop it), whether
anything has arrived on each expected input; one still silent after
``diagnostics.no_input_warn_s`` gets one WARN naming the topic, its publishers and the image
topics the ROS graph does have (not the node's own outputs nor its other inputs), since a wrong
remap or a compressed stream into a raw subscription otherwise shows only in ``/diagnostics``.
camera_info is optional (only compared with the estimate) and is not watched.
"""

from __future__ import annotations

from dataclasses import dataclass
import time
from typing import Any, Callable

from lingbot_map_ros.ros.parameters import input_params
from lingbot_map_ros.ros.publishers.callback_guard import guard_timer

IMAGE_TYPES = ('sensor_msgs/msg/Image', 'sensor_msgs/msg/CompressedImage')
_CHECK_PERIOD_S = 0.5


@dataclass(frozen=True)
class WatchedInput:
    """An expected input: its label, resolved topic and how many messages it has taken."""

    label: str
    """What it is: 'image', 'depth', 'front image'."""
    topic: str
    """Resolved topic name."""
    received: Callable[[], int]
    """Messages taken since start."""
    remap: str
    """How to point it at another topic (launch argument or ``-r``)."""


def watched_inputs(node: Any, values: dict[str, Any], pipeline: Any) -> list[WatchedInput]:
    """Return the node's expected inputs (each camera's image; depth when metric is on)."""
    cameras, out = pipeline.cameras, []
    for name in cameras.names:
        remap = (f'cameras:={name}=TOPIC in the launch file, or -r {name}/image:=TOPIC' if name
                 else 'image_topic:= in the launch file, or -r image:=TOPIC')
        out.append(WatchedInput(f'{name} image'.lstrip(), cameras.topics[name],
                                lambda stats=cameras.stats[name]: stats.received_total, remap))
        depth = cameras.runners[name].depth_input
        if depth is not None:
            out.append(WatchedInput('depth', node.resolve_topic_name('depth'),
                                    lambda depth=depth: depth.received_total,
                                    'depth_topic:= in the launch file, or -r depth:=TOPIC'))
    return out


def startup_line(node: Any, values: dict[str, Any], pipeline: Any) -> str:
    """Return the one line that says what the node listens to and what runs."""
    suffix = '/compressed' if values['input.transport'] == 'compressed' else ''
    names = input_params.camera_names(values)
    if names:
        inputs = '; '.join(
            f"{name}: image '{node.resolve_topic_name(f'{name}/image') + suffix}', camera_info "
            f"'{node.resolve_topic_name(f'{name}/camera_info')}'" for name in names)
        inputs = f'{len(names)} cameras ({inputs}), primary {input_params.primary_camera(values)}'
    else:
        inputs = (f"image '{node.resolve_topic_name('image') + suffix}', camera_info "
                  f"'{node.resolve_topic_name('camera_info')}'")
        if values['metric.source'] == 'depth':
            inputs += f", depth '{node.resolve_topic_name('depth')}'"
    if values.get('input.imu_topic'):  # docs/imu.md
        inputs += f", imu '{node.resolve_topic_name(values['input.imu_topic'])}'"
    metric = 'metric: on (depth camera, outputs in metres)' \
        if values['metric.source'] == 'depth' else 'metric: off (model units)'
    config = pipeline.config
    return (f"listening on {inputs} ({values['input.transport']}, {values['input.queue_mode']} "
            f'mode, converter {"cv_bridge" if pipeline.has_bridge else "built-in"}); {metric}; '
            f'model {config.model.preset} on {config.stream.device}, backend '
            f'{backend_in_use(pipeline)}, weights {pipeline.session.weights}; '
            f'{loop_closure_state(pipeline)}')


def loop_closure_state(pipeline: Any) -> str:
    """Return ``loop closure: on`` / ``off`` (and why) / ``unavailable: <reason>``."""
    loop = getattr(pipeline, 'loop_output', None)
    if loop is None:
        return 'loop closure: off (several cameras)'
    state, reason = loop.feed.state, loop.feed.reason
    if state == 'off':
        return f'loop closure: off ({reason})'
    if state == 'unavailable':
        return f'loop closure: unavailable ({reason})'
    return 'loop closure: on'


def backend_in_use(pipeline: Any) -> str:
    """Return the attention backend the session runs (``auto`` resolved after the warm-up)."""
    configured = pipeline.config.cache.backend
    try:
        cache = pipeline.session.session.stats().cache
    except AttributeError:  # no session (a failed warm-up)
        cache = None
    if cache is None:
        return configured
    return cache.backend if configured != 'auto' else f'{cache.backend} (auto)'


class InputWatch:
    """Warns once per expected input that nothing has arrived on it for a while."""

    def __init__(self, node: Any, inputs: list[WatchedInput], warn_after_s: float,
                 now: Callable[[], float] = time.monotonic) -> None:
        """Start watching (a steady timer on ``node``); ``warn_after_s`` 0 watches nothing.

        Args:
            node: the rclpy node (its logger, graph and timers).
            inputs: the expected inputs.
            warn_after_s: silence before the warning, from now.
            now: the clock the silence is measured on (seconds).
        """
        from rclpy.clock import Clock, ClockType

        self._node = node
        self._now = now
        self._start = now()
        self._deadline = self._start + warn_after_s
        self._pending = list(inputs) if warn_after_s > 0 else []
        self._timer = node.create_timer(_CHECK_PERIOD_S,
                                        guard_timer(node.get_logger(), 'input watch', self.check),
                                        clock=Clock(clock_type=ClockType.STEADY_TIME)) \
            if self._pending else None

    def check(self) -> list[str]:
        """Warn about each input still silent past the deadline; return the warnings issued."""
        if not self._pending or self._now() < self._deadline:
            return []
        warnings = []
        for watched in self._pending:
            if watched.received() == 0:
                warnings.append(self._warning(watched))
                self._node.get_logger().warning(warnings[-1])
        self._pending = []
        self.destroy()
        return warnings

    def destroy(self) -> None:
        """Stop the timer (idempotent)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            self._node.destroy_timer(timer)

    def _warning(self, watched: WatchedInput) -> str:
        own = self._node.get_fully_qualified_name().rstrip('/') + '/'  # our ~/depth/image
        # The node's own inputs (a depth subscription waiting on its camera) are no candidate.
        subscribed = {name for name, _ in self._node.get_subscriber_names_and_types_by_node(
            self._node.get_name(), self._node.get_namespace())}
        images = [f"{name} [{', '.join(t.rpartition('/')[2] for t in types)}]"
                  for name, types in self._node.get_topic_names_and_types()
                  if any(t in IMAGE_TYPES for t in types) and name != watched.topic
                  and not name.startswith(own) and name not in subscribed]
        publishers = self._node.count_publishers(watched.topic)
        why = (f'{publishers} publisher(s) on it but nothing arrived: check the QoS '
               '(input.qos.reliability) and the message type' if publishers else
               'no publisher on it')
        found = ('image topics in the graph: ' + ', '.join(images)) if images else \
            'the graph has no image topic'
        hint = "; a '/compressed' topic needs input.transport: compressed" \
            if watched.label != 'depth' else ''
        return (f"no {watched.label} received on '{watched.topic}' in "
                f'{self._now() - self._start:.0f} s ({why}); {found}. Remap the input '
                f'({watched.remap}){hint}')
