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
"""The node's cameras as one group: their runners, groups of frames, one odometry.

Every camera is a :class:`~lingbot_map_ros.ros.inference.session_runner.SessionRunner` on its own
session, all sessions streams of one engine (one model, one page pool). A node without
``input.cameras`` is a group of one unnamed camera (``''``): its outputs are the node's own
(``~/pose``, TF, ``~/map`` through ``MapOutput.publish``) and it needs no rig. Named cameras
(``input.cameras``) publish under ``~/<name>/``, in the node's odom: :class:`CameraLink` passes
each base pose through the :class:`~lingbot_map_ros.engine.cameras.camera_rig.CameraRig`, which
aligns it to the primary camera and names the camera that drives the fused ``~/pose``,
``~/odometry``, ``~/path`` and TF (``odom -> base_frame``), with failover to the next live
camera. ``~/map`` takes every camera's keyframes, each through its camera's alignment.

Frames of different cameras whose stamps are within ``input.sync_tolerance_s`` and that wait
in the queue together (``camera_queue.CameraQueue``) are one group, fed through
:func:`feed_group`; a frame with no partner waiting goes alone. A camera's bad frame is
dropped and counted on its own counters; an error in one camera's outputs is counted there and
never stops the others of its group.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

from lingbot_map_ros.engine.cameras.camera_batch import BatchFeedError, BatchStats, feed_batch
from lingbot_map_ros.engine.cameras.camera_rig import CameraRig
from lingbot_map_ros.engine.frames import FrameTag
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.engine.session.reasons import Reason
from lingbot_map_ros.engine.session.stream_feeder import FeedResult, StreamFeeder
from lingbot_map_ros.ros.inference import depth_input
from lingbot_map_ros.ros.inference.camera_queue import CameraQueue
from lingbot_map_ros.ros.inference.camera_sizes import CameraSizes
from lingbot_map_ros.ros.inference.session_runner import InputFrame, SessionRunner
from lingbot_map_ros.ros.parameters import input_params
from lingbot_map_ros.ros.parameters.node_options import NodeOptions
from lingbot_map_ros.ros.publishers import diagnostics
from lingbot_map_ros.ros.publishers.diagnostics import NodeStats
from lingbot_map_ros.ros.publishers.map_output import MapOutput
from lingbot_map_ros.ros.publishers.outputs import Outputs
from lingbot_map_ros.ros.publishers.service_qos import service_qos
import numpy as np


def feed_group(feeders: Sequence[StreamFeeder], images: Sequence[np.ndarray],
               tags: Sequence[FrameTag], stats: BatchStats | None = None
               ) -> tuple[list[FeedResult | None], dict[int, Exception]]:
    """Feed one group of synchronised frames, one per camera, the model work as one batch.

    Returns:
        Each camera's result (None where it raised) and the errors by position: a camera that
        raises never costs the others their frames.
    """
    try:
        return feed_batch(feeders, images, tags, stats), {}
    except BatchFeedError as exc:
        return exc.results, dict(exc.errors)


def camera_options(options: NodeOptions, solo: bool = False) -> NodeOptions:
    """Return a camera's options: a named camera's frame ids are its images' own."""
    return options if solo else dataclasses.replace(options, camera_frame='')


class CameraLink:
    """One camera's tie to the group: the aligner of its outputs and its share of the map."""

    def __init__(self, group: CameraGroup, name: str) -> None:
        """Link camera ``name`` to ``group``."""
        self._group = group
        self.name = name
        self.outputs: Outputs | None = None
        self._fused: np.ndarray | None = None

    def aligned(self, pred: FramePrediction, base_in_own_odom: np.ndarray) -> np.ndarray:
        """Return the base pose in the node's odom (``Outputs`` calls it for every pose)."""
        aligned, self._fused = self._group.take_pose(self.name, pred, base_in_own_odom)
        return aligned

    def odom_from_own_odom(self) -> np.ndarray:
        """Return the similarity from this camera's odom into the node's."""
        return self._group.similarity(self.name)

    def publish(self, pred: FramePrediction, camera_frame: str, opts: NodeOptions) -> None:
        """Log a fused pose for ``~/save`` and add a keyframe to ``~/map`` (after ``Outputs``)."""
        group = self._group
        if self._fused is not None:
            group.map_output.log_pose(pred, camera_frame, self._fused, opts)
            self._fused = None
        group.map_output.add_keyframe(pred, self.outputs.odom_from_world, opts)

    def clear(self) -> None:
        """Forget this camera's alignment (its session was reset)."""
        self._group.camera_reset(self.name)


class CameraGroup:
    """The runners of every camera, the map, the rig and the fused odometry."""

    def __init__(self, node: Any, values: dict[str, Any], sessions: dict[str, Any],
                 options: NodeOptions, convert_raw: Callable[[Any], np.ndarray],
                 device: str) -> None:
        """Create the fused outputs, ``~/map`` and, per camera, its outputs and runner.

        Args:
            node: the rclpy node.
            values: the node's parameter values (with the per-camera mountings).
            sessions: ``{name: RolloverSession}`` in ``input.cameras`` order, one engine
                (``{'': session}`` for the one unnamed camera).
            options: the node options at start.
            convert_raw: the ``sensor_msgs/Image`` converter.
            device: the engine's device (the map's).

        Raises:
            ValueError: a bad mounting.
        """
        self._log = node.get_logger()
        self.names = tuple(sessions)
        self.solo = self.names == ('',)
        """One unnamed camera: its outputs are the node's, no rig (loop closure runs)."""
        self.primary = input_params.primary_camera(values)
        self.tolerance_ns = int(round(values['input.sync_tolerance_s'] * 1e9))
        self.rig = CameraRig(self.names, self.primary, self.tolerance_ns,
                             values['diagnostics.stale_after_s'])
        config = next(iter(sessions.values())).session.config
        self.sizes = CameraSizes(self.primary, config.stream.image_width,
                                 config.model.patch_size)
        self._rig_lock = threading.Lock()
        self._destroyed = False
        self._options = options
        self._camera_opts = camera_options(options, self.solo)
        self._order = {name: i for i, name in enumerate(self.names)}
        suffix = '/compressed' if values['input.transport'] == 'compressed' else ''
        # Resolved (namespace and remaps applied), as the input status shows it.
        self.topics = {name: node.resolve_topic_name(input_params.camera_topic(name, 'image'))
                       + suffix for name in self.names}
        self.stats = {name: NodeStats() for name in self.names}
        self.batch_stats = BatchStats()
        self.outputs: dict[str, Outputs] = {}
        self.runners: dict[str, SessionRunner] = {}
        self.fused = self._add_cameras(node, values, sessions, convert_raw)
        self.map_output = MapOutput(node, options, device, self.fused.frames,
                                    self._frames_info(values), service_qos=service_qos())
        if self.solo:  # the one camera's poses are the node's: its map is the plain one
            self.runners[''].add_outputs(self.map_output)

    def _add_cameras(self, node: Any, values: dict[str, Any], sessions: dict[str, Any],
                     convert_raw: Callable[[Any], np.ndarray]) -> Outputs:
        """Create each camera's outputs and runner; return the outputs of ``~/pose`` and TF."""
        fused = None if self.solo else Outputs(node, values, self.stats[self.primary])
        for name, session in sessions.items():
            stats, extras = self.stats[name], ()
            log = node.get_logger().get_child(name) if name else node.get_logger()
            if self.solo:
                outputs = Outputs(node, values, stats)
            else:
                link = CameraLink(self, name)
                mount = values[input_params.mount_param(name)]
                link.outputs = outputs = Outputs(
                    node, {**values, 'frames.base_to_camera': mount}, stats,
                    prefix=f'~/{name}/', broadcast_tf=False, aligner=link)
                extras = (link,)
            self.outputs[name] = outputs
            self.runners[name] = SessionRunner(
                session, outputs, stats, log, self._camera_opts, convert_raw,
                extra_outputs=extras, depth_input=depth_input.from_values(values, stats, log))
        return fused if fused is not None else self.outputs['']

    def _frames_info(self, values: dict[str, Any]) -> dict[str, str]:
        """Return the frames ``~/save`` reports: the mounting is per camera when named."""
        if self.solo:
            return self.fused.frames_info()
        return {'odom_frame': values['frames.odom_frame'],
                'base_frame': values['frames.base_frame'], 'mounting': 'per camera'}

    def destroy(self) -> None:
        """Destroy every camera's publishers, the fused ones and the map's."""
        self._destroyed = True
        for outputs in {id(o): o for o in (self.fused, *self.outputs.values())}.values():
            outputs.destroy()
        self.map_output.destroy()

    # ---- frames (worker thread) -----------------------------------------------------------------

    def handle(self, item: InputFrame, queue: CameraQueue | None = None) -> None:
        """Process ``item`` and the frames of other cameras waiting in sync with it."""
        group = [item] + (queue.take_synced(item, self.tolerance_ns)
                          if queue is not None else [])
        self.handle_group(group)

    def handle_group(self, items: list[InputFrame]) -> None:
        """Feed one frame per camera as one group; each camera publishes its own results."""
        opts = self._camera_opts
        # The primary first: its pose at a stamp is the fused one, never a repeat of another
        # camera's at that stamp (also the one lock order of every group).
        items = sorted(items, key=lambda i: (i.camera != self.primary, self._order[i.camera]))
        runners = [self.runners[i.camera] for i in items]
        with contextlib.ExitStack() as stack:
            for runner in runners:
                stack.enter_context(runner.busy())
            ready = []
            for runner, item in zip(runners, items):
                prepared = runner.prepare(item, opts)
                if prepared is not None and self._size_fits(item.camera, prepared[0]):
                    ready.append((runner, prepared))
            if not ready:
                return
            for runner, _ in ready:
                stack.enter_context(runner.lock)
            feeders = [runner.begin(opts) for runner, _ in ready]
            results, errors = feed_group(feeders, [p[0] for _, p in ready],
                                         [p[1] for _, p in ready], self.batch_stats)
            for k, ((runner, _), fed) in enumerate(zip(ready, results)):
                if k in errors:
                    self._camera_error(runner, errors[k])
                    continue
                try:
                    runner.finish(fed, opts)
                except Exception as exc:  # noqa: BLE001 - one camera never stops the others
                    self._camera_error(runner, exc)

    def _size_fits(self, name: str, image: np.ndarray) -> bool:
        """Apply the size rule (``camera_sizes.py``): the primary's size is the engine's."""
        verdict = self.sizes.check(name, image.shape[:2])
        for other in verdict.reset:
            self._log.warning(f'camera {other}: reset, its images are not the size of the '
                              f"primary camera '{self.primary}'")
            self.runners[other].reset(Reason.RESOLUTION_CHANGED, 5.0,
                                      f"the primary camera '{self.primary}' sets the size")
        if not verdict.accepted:
            self.stats[name].count_drop(Reason.RESOLUTION_MISMATCH, verdict.detail)
            if verdict.warn:
                self._log.warning(f'{verdict.detail}: its frames are dropped '
                                  '(drops.resolution_mismatch)')
        return verdict.accepted

    def _camera_error(self, runner: SessionRunner, exc: Exception) -> None:
        if self._destroyed:  # a frame abandoned at cleanup: what it writes to is gone
            return
        name = next(n for n, r in self.runners.items() if r is runner)
        self.stats[name].count_error(f'{type(exc).__name__}: {exc}')
        camera = f'camera {name}: ' if name else ''
        self._log.error(f'{camera}{type(exc).__name__}: {exc}', throttle_duration_sec=5.0)

    def take_pose(self, name: str, pred: FramePrediction, base: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray | None]:
        """Pass a camera's base pose to the rig; publish the fused odometry from the source.

        Returns:
            The pose in the node's odom and the fused pose (None unless ``name`` is the source).
        """
        received = pred.tag.received_s if pred.tag is not None else None
        now = time.monotonic() if received is None else received
        with self._rig_lock:
            update = self.rig.add(name, pred.stamp_ns, base, now)
        if update.switched_from is not None:
            self._log.warning(f"odometry source: camera '{name}' continues odom -> base from "
                              f"'{update.switched_from}' (no pose from it for "
                              f'{self.rig.stale_after_s:g} s, or it is back)')
        if update.not_newer:
            self._log.warning(f"odometry source '{name}': pose at {pred.stamp_ns * 1e-9:.6f} s "
                              'is not newer than the last fused one: not published (counted '
                              'as fused_not_newer in the cameras status)',
                              throttle_duration_sec=5.0)
        if update.fused is not None:
            self.fused.publish_base(update.fused, pred.stamp_ns, self._options)
        return update.aligned, update.fused

    def similarity(self, name: str) -> np.ndarray:
        """Return the similarity from camera ``name``'s odom into the node's ([4, 4])."""
        with self._rig_lock:
            return self.rig.similarity(name)

    def camera_reset(self, name: str) -> None:
        """Forget camera ``name``'s alignment; the primary's reset restarts odom and the map."""
        with self._rig_lock:
            self.rig.clear(name)
        self.sizes.forget(name)
        if name == self.primary:
            self.fused.clear()
            self.map_output.clear()

    # ---- control (any thread) -------------------------------------------------------------------

    def set_options(self, options: NodeOptions, stale_after_s: float) -> None:
        """Use ``options`` from the next frame on."""
        self._options = options
        self._camera_opts = camera_options(options, self.solo)
        self.rig.stale_after_s = stale_after_s
        for runner in self.runners.values():
            runner.set_options(self._camera_opts)

    @property
    def reset_pending(self) -> bool:
        """Return True when a reset waits for a camera's next frame."""
        return any(r.reset_pending for r in self.runners.values())

    def request_reset(self, reason: str) -> None:
        """Reset every camera before its next frame."""
        for runner in self.runners.values():
            runner.request_reset(reason)

    def reset(self, reason: str, timeout_s: float) -> dict[str, int] | None:
        """Reset every camera, the primary last; None when one was busy (then it is pending)."""
        cleared: collections.Counter = collections.Counter()
        busy = False
        for name in sorted(self.names, key=lambda n: n == self.primary):
            done = self.runners[name].reset(reason, timeout_s)
            if done is None:
                busy = True
            else:
                cleared.update(done)
        return None if busy else dict(cleared)

    # ---- diagnostics ----------------------------------------------------------------------------

    def statuses(self, node_name: str, values: dict[str, Any], primary_report: Any,
                 pool: Any, scale_frames: int) -> list[Any]:
        """Return each named camera's input and engine status and the ``cameras`` status.

        The one unnamed camera's statuses are the node's own (``node_services.py``).
        """
        out: list[Any] = []
        if self.solo:
            return out
        for name in self.names:
            runner = self.runners[name]
            report = primary_report if name == self.primary else self.stats[name].roll()
            info = {'topic': self.topics[name], 'transport': values['input.transport'],
                    'queue_mode': values['input.queue_mode'], 'queue_length': 0}
            prefix = f'{node_name}/{name}'
            out.append(diagnostics.input_status(prefix, report, info,
                                                values['diagnostics.stale_after_s']))
            out.append(diagnostics.engine_status(prefix, report, runner.session_stats(),
                                                 scale_frames))
        now = time.monotonic()
        with self._rig_lock:
            states, source, switches = self.rig.states(now), self.rig.source, self.rig.switches
            not_newer = self.rig.not_newer
        values_out: dict[str, Any] = {'primary': self.primary, 'source': source,
                                      'switches': switches, 'cameras': ','.join(self.names),
                                      'fused_not_newer': not_newer,
                                      'pool_pages': pool.pool_pages_total,
                                      'pool_free': pool.pool_pages_free,
                                      'pool_streams': pool.pool_streams,
                                      'batches': self.batch_stats.batches,
                                      'batched_frames': self.batch_stats.batched_frames,
                                      'alone_frames': self.batch_stats.alone_frames}
        for state in states:
            values_out.update({f'{state.name}.scale': state.scale,
                               f'{state.name}.residual': state.residual,
                               f'{state.name}.matched': state.matched,
                               f'{state.name}.degenerate': state.degenerate,
                               f'{state.name}.live': state.live,
                               f'{state.name}.frames': state.frames})
        stale = [s.name for s in states if not s.live]
        if source != self.primary:
            level = diagnostics.WARN
            message = f"odometry from '{source}': primary '{self.primary}' is stale"
        elif stale:
            level, message = diagnostics.WARN, f"no pose for a while from {', '.join(stale)}"
        else:
            level, message = diagnostics.OK, f"{len(self.names)} cameras, odometry from '{source}'"
        out.append(diagnostics.status(f'{node_name}: cameras', level, message, source,
                                      values_out))
        return out
