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
"""The loop-closed outputs in ``map`` (REP 105) and the ``<node>: loop`` diagnostic status.

TF ``map -> odom``, ``~/map_pose``, ``~/map_path`` and ``~/loop_closures``.

Frames. The engine's continuous world is ``odom`` up to the rigid anchor ``A = T_odom_world``
(``odom_frames.py``); the pose graph's ``map`` starts equal to it (``map_from_odom`` = I) and
is mapped to ROS by the same ``A``. Per frame: the camera in ``map`` is the Sim(3)
``A @ D @ C`` (``D`` the closer's ``map_from_odom``, ``C`` the engine pose), its rigid part (the
camera's centre and orientation) gives ``base`` in ``map``, and TF ``map -> odom`` is
``T_map_base @ inv(T_odom_base)``: a rigid transform that puts ``base_link`` where the graph
says (a scale correction cannot be a TF, so it is anchored at the current pose).
``~/odometry`` and ``odom -> base_link`` are not touched. ``~/map_pose`` carries the latest
keyframe's marginal covariance rotated into ``map`` (translation in odom units, rotation in
radians). ``~/map_path`` (all corrected keyframes) and ``~/loop_closures`` are republished by a
timer (:data:`GRAPH_PERIOD_S`, steady time: it runs on when a replay's ``/clock`` stops) when the
graph has changed, off the inference thread.

With an IMU that levels ``map`` rather than ``odom`` (``engine/imu/leveling.py``), this run's
``map`` is the graph's turned by that levelling (``OdomFrames.map_level``); a loaded map keeps
its own frame.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import Point, PoseStamped, PoseWithCovarianceStamped, TransformStamped
from lingbot_map_ros.config import LoopConfig
from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.mapping.backend import MAP_KEYS, MappingBackend
from lingbot_map_ros.engine.mapping.loop_closer import LoopCloser
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.parameters.node_options import NodeOptions
from lingbot_map_ros.ros.publishers import diagnostics
from lingbot_map_ros.ros.publishers.callback_guard import guard_timer
from lingbot_map_ros.ros.publishers.outputs import Outputs, UNKNOWN_VARIANCE
from nav_msgs.msg import Path
import numpy as np
from rclpy.clock import Clock, ClockType
from rclpy.qos import DurabilityPolicy, QoSProfile
from std_msgs.msg import Bool, ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

try:  # tf2_ros comes with a ROS install, not with the PyPI wheels.
    from tf2_ros import TransformBroadcaster
except ImportError:  # pragma: no cover - depends on the machine
    TransformBroadcaster = None

LOOP_KEYS: tuple[str, ...] = (
    'state', 'reason', 'map_frame', 'keyframes', 'queued', 'candidates', 'replaced', 'verified',
    'accepted', 'rejected', 'rejected_verification', 'rejected_graph', 'verification_errors',
    'dropped_keyframes', 'last_correction_m', 'last_correction_deg', 'optimisation_ms',
    'map_to_odom.x', 'map_to_odom.y', 'map_to_odom.z', 'map_to_odom.yaw_deg',
    'map_to_odom.scale', 'index_backend', 'images_stored', 'image_bytes',
    'last_rejection', 'skipped', 'localized', 'graph_recoveries', 'graph_loops_removed',
    'graph_loops_adopted', 'imu_factors', 'imu_skipped') + MAP_KEYS
"""Keys of the ``loop`` status, in order, in every state."""

_COUNTS = ('keyframes', 'queued', 'candidates', 'replaced', 'verified', 'accepted',
           'rejected_verification', 'rejected_graph', 'verification_errors', 'images_stored',
           'image_bytes', 'skipped', 'graph_recoveries', 'graph_loops_removed',
           'graph_loops_adopted')
GRAPH_PERIOD_S = 0.25
"""Period of the check that republishes ``~/map_path`` and ``~/loop_closures``."""
_ACCEPTED = ColorRGBA(r=0.1, g=0.9, b=0.2, a=1.0)
_REJECTED = ColorRGBA(r=0.9, g=0.1, b=0.1, a=1.0)


class KeyframeFeed(Protocol):
    """What the loop outputs use of the keyframe feed (``ros/inference/loop_feed.LoopFeed``)."""

    config: LoopConfig
    state: str
    """``off``, ``unavailable`` or ``running`` (the ``loop`` status)."""
    reason: str
    backend: MappingBackend
    """The mapping back end (the closer, the loaded map)."""
    stamps: list[int]
    """Stamp (ns) of each fed keyframe."""
    num_dropped: int

    @property
    def closer(self) -> LoopCloser | None:
        """Return the running LoopCloser, or None."""

    def feed(self, pred: FramePrediction) -> None:
        """Queue a keyframe (other frames only pace the verification)."""

    def reset(self) -> None:
        """Forget the run."""

    def close(self) -> None:
        """Stop the closer and the verifier."""


def _last_rejection(edges: list) -> str:
    """Return the latest rejected pair and why (the verifier's reason or the graph's), or none."""
    for edge in reversed(edges):
        if not edge.accepted:
            return f'{edge.query} -> {edge.candidate}: {edge.reason}'
    return 'none'


def rigid(pose: np.ndarray) -> np.ndarray:
    """Return the rigid part of a [4, 4] Sim(3): its rotation and translation (the centre)."""
    return sim3.make(sim3.rotation_of(pose), pose[:3, 3])


class LoopOutput:
    """Publishes the map outputs of one camera's loop closure (module docstring)."""

    def __init__(self, node: Any, values: dict[str, Any], feed: KeyframeFeed,
                 outputs: Outputs) -> None:
        """Create the publishers (they stay silent while loop closure is off).

        Args:
            node: the rclpy node.
            values: parameter values (``frames.*``, ``publish.map_tf``).
            feed: the keyframe feed (owns the closer).
            outputs: the node's ``Outputs`` (the odom anchor and the mounting).
        """
        self._node = node
        self._feed = feed
        self._outputs = outputs
        self._map_frame = values['frames.map_frame']
        self._odom_frame = values['frames.odom_frame']
        self._base_frame = values['frames.base_frame']
        active = feed.config.enable and bool(self._map_frame)
        self._tf = TransformBroadcaster(node) if (
            active and values['publish.map_tf'] and TransformBroadcaster is not None) else None
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self._pose_pub = node.create_publisher(PoseWithCovarianceStamped, '~/map_pose',
                                               QoSProfile(depth=10))
        self._path_pub = node.create_publisher(Path, '~/map_path', latched)
        self._marker_pub = node.create_publisher(MarkerArray, '~/loop_closures', latched)
        self._localized_pub = node.create_publisher(Bool, '~/localized', latched)
        self._localized: bool | None = None
        """The last ``~/localized`` published (None before the first)."""
        self._published = (-1, -1, -1)
        self._map_from_odom = np.eye(4)
        self._lock = threading.Lock()
        self._anchor: tuple[np.ndarray, np.ndarray] | None = None
        """(``T_odom_world``, ``inv(mount)``) of the latest frame, for the timer."""
        # Steady time: under use_sim_time a bag that stops stops /clock, and the path and the
        # markers must still follow the graph (the worker finishes its queue after the bag).
        self._timer = node.create_timer(
            GRAPH_PERIOD_S, guard_timer(node.get_logger(), 'map path', self._refresh),
            clock=Clock(clock_type=ClockType.STEADY_TIME)) if active else None

    @property
    def feed(self) -> KeyframeFeed:
        """Return the keyframe feed, which owns the closer."""
        return self._feed

    @property
    def active(self) -> bool:
        """Return whether loop closure is on with a map frame (``~/map`` is then in it)."""
        return self._timer is not None

    @property
    def map_frame(self) -> str:
        """Return ``frames.map_frame``."""
        return self._map_frame

    def camera_in_map(self, c2w: np.ndarray) -> np.ndarray | None:
        """Return ROS ``map`` from a camera of continuous pose ``c2w``, by the latest correction.

        None while nothing is published in ``map`` (no odom anchor yet, or a loaded map not
        localized in yet).
        """
        placed = self._graph_frame()
        if placed is None:
            return None
        map_anchor, closer = placed
        world_to_map = closer.map_from_odom() if closer is not None else np.eye(4)
        return map_anchor @ world_to_map @ np.asarray(c2w, np.float64)

    def corrected_cameras(self, unless: tuple | None = None
                          ) -> tuple[tuple, np.ndarray | None, np.ndarray | None]:
        """Return this run's keyframes in the graph: (state key, [K] stamps, [K, 4, 4] poses).

        The poses are ROS ``map`` from camera; the key (closer, version, map state, the IMU's
        levelling of ``map``) changes with every correction. A loaded map's own keyframes are
        left out. When the key equals ``unless`` nothing changed: the stamps and poses are None
        (not copied).
        """
        closer = self._feed.closer
        levelled = self._outputs.frames.map_level_version  # the IMU levelled map: re-placed
        placed = self._graph_frame()
        if closer is None or placed is None:
            return (id(closer), -1, 'none'), np.zeros(0, np.int64), np.zeros((0, 4, 4))
        key = (id(closer), closer.version, closer.map_state)  # read before the poses
        key += (levelled,)
        if key == unless:
            return key, None, None
        poses, stamps = closer.corrected_poses(), closer.node_stamps()
        count = min(len(poses), len(stamps))
        offset = min(closer.stats()['map_keyframes'], count)
        return key, stamps[offset:count], placed[0] @ poses[offset:count]

    def _graph_frame(self) -> tuple[np.ndarray, LoopCloser] | None:
        """Return (ROS ``map`` from the graph's frame, the closer), or None (nothing in map)."""
        if not self._map_frame or self._feed.state == 'off' or not self._outputs.frames.anchored:
            return None
        closer, backend = self._feed.closer, self._feed.backend
        if not backend.published():
            return None
        anchor = self._outputs.frames.odom_from_world()
        return self._levelled(backend.frame_from_graph(anchor), anchor), closer

    def _levelled(self, frame: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        """Return ROS ``map`` from the graph's frame with the IMU's levelling of ``map``.

        This run's graph only (``frame`` is ``anchor``): a loaded map keeps its own frame. The
        levelling is the identity without an IMU or while odom itself is levelled
        (``engine/imu/leveling.py``).
        """
        return self._outputs.frames.map_level() @ frame if frame is anchor else frame

    def localized(self) -> bool:
        """Return whether poses are published in ``map`` (``~/localized``).

        Loop closure runs and, with a loaded map, the run is tied to it (``map_reuse.py``);
        False while searching or after a map to localize in was refused.
        """
        feed = self._feed
        if not self._map_frame or feed.state != 'running':
            return False
        return feed.backend.published()

    def publish(self, pred: FramePrediction, camera_frame: str, opts: NodeOptions) -> None:
        """Feed a keyframe to the closer; publish TF map -> odom and ``~/map_pose``."""
        self._feed.feed(pred)
        self._publish_localized()
        if not self._map_frame or self._feed.state == 'off' or not self._outputs.frames.anchored:
            return
        closer = self._feed.closer
        backend = self._feed.backend
        if not backend.published():
            # A loaded map: nothing in map until localized in it (map_reuse.py); TF map ->
            # odom stays where it was (a tf listener keeps working), then jumps once.
            if self._tf is not None:
                header = PoseStamped().header
                header.frame_id = self._map_frame
                conversions.fill_stamp(header.stamp, pred.stamp_ns)
                self._publish_tf(header)
            return
        world_to_map = closer.map_from_odom() if closer is not None else np.eye(4)
        anchor = self._outputs.frames.odom_from_world()
        # ROS map from the graph's frame: this run's anchor, or the loaded map's own.
        map_anchor = self._levelled(backend.frame_from_graph(anchor), anchor)
        mount_inv = sim3.inverse(self._outputs.frames.mount)
        base_in_odom = anchor @ pred.c2w @ mount_inv
        camera_in_map = map_anchor @ world_to_map @ pred.c2w
        base_in_map = rigid(camera_in_map) @ mount_inv
        self._map_from_odom = base_in_map @ sim3.inverse(base_in_odom)
        header = PoseStamped().header
        header.frame_id = self._map_frame
        conversions.fill_stamp(header.stamp, pred.stamp_ns)
        if self._tf is not None:
            self._publish_tf(header)
        covariance = closer.latest_covariance() if closer is not None else np.zeros((7, 7))
        self._publish_pose(header, base_in_map, sim3.rotation_of(camera_in_map), covariance)
        with self._lock:
            self._anchor = (map_anchor, mount_inv)

    def clear(self) -> int:
        """Forget the run (session reset): a new graph; returns the keyframes dropped."""
        count = len(self._feed.stamps)
        self._feed.reset()
        with self._lock:
            self._published = (-1, -1, -1)
            self._anchor = None
        self._map_from_odom = np.eye(4)
        return count

    def destroy(self) -> None:
        """Stop the closer and destroy the publishers."""
        if self._timer is not None:
            self._node.destroy_timer(self._timer)
        self._feed.close()
        for pub in (self._pose_pub, self._path_pub, self._marker_pub, self._localized_pub):
            self._node.destroy_publisher(pub)
        if self._tf is not None:
            self._node.destroy_publisher(self._tf.pub_tf)

    def map_from_odom(self) -> np.ndarray:
        """Return the last published TF ``map -> odom`` as [4, 4] (identity before the first)."""
        return self._map_from_odom.copy()

    def status(self, node_name: str) -> DiagnosticStatus:
        """Render the ``<node>: loop`` status: the same keys in every state (``n/a`` unknown)."""
        feed = self._feed
        closer = feed.closer
        stats = closer.stats() if closer is not None else {}
        values: dict[str, Any] = dict.fromkeys(LOOP_KEYS)
        values.update(state=feed.state, reason=feed.reason, map_frame=self._map_frame or 'none',
                      dropped_keyframes=feed.num_dropped,
                      localized='true' if self.localized() else 'false')
        values.update(feed.backend.map_status())
        if values['map_state'] == 'searching' and feed.state == 'running':
            values['state'] = 'searching'
        if stats:
            values.update({k: stats[k] for k in _COUNTS})
            values['rejected'] = stats['rejected_verification'] + stats['rejected_graph']
            for key in ('last_correction_m', 'last_correction_deg', 'optimisation_ms',
                        'index_backend'):
                values[key] = stats[key]
            if not np.isfinite(values['optimisation_ms']):  # none yet: n/a, never 'nan'
                values['optimisation_ms'] = None
            values['last_rejection'] = _last_rejection(closer.loop_edges())
        rotations = feed.backend.rotations
        if rotations is not None:  # with an IMU: its rotation factors (n/a without)
            values['imu_factors'] = stats.get('graph_imu_factors', 0)
            values['imu_skipped'] = rotations.num_skipped
        m = self._map_from_odom
        values.update({'map_to_odom.x': m[0, 3], 'map_to_odom.y': m[1, 3],
                       'map_to_odom.z': m[2, 3],
                       'map_to_odom.yaw_deg': float(np.degrees(np.arctan2(m[1, 0], m[0, 0]))),
                       'map_to_odom.scale': float(sim3.scale_of(
                           stats.get('map_from_odom', np.eye(4))))})
        level, message = DiagnosticStatus.OK, feed.state
        if feed.state == 'unavailable':
            level, message = DiagnosticStatus.WARN, f'unavailable: {feed.reason}'
        elif stats and (stats['verification_errors'] or stats['errors']):
            level, message = DiagnosticStatus.WARN, 'verification errors (see the log)'
        elif values['state'] == 'searching':
            message = (f"searching in the map {values['map_path']} "
                       f"({values['map_matches']} agreeing matches)")
        elif values.get('map_state') == 'refused':
            level = DiagnosticStatus.WARN
            message = f"not localized: {values['map_error']}"
        elif feed.state == 'running':
            message = f"running: {values['accepted']} loops closed" if stats else 'running'
        return diagnostics.status(f'{node_name}: loop', level, message, node_name, values)

    def _publish_localized(self) -> None:
        """Publish ``~/localized`` (latched) when it changed."""
        now = self.localized()
        with self._lock:
            if now == self._localized:
                return
            self._localized = now
        self._localized_pub.publish(Bool(data=now))

    def _publish_tf(self, header: Header) -> None:
        tf = TransformStamped(header=header, child_frame_id=self._odom_frame)
        position, quat = conversions.c2w_to_pose(self._map_from_odom)
        t, r = tf.transform.translation, tf.transform.rotation
        t.x, t.y, t.z = (float(v) for v in position)
        r.x, r.y, r.z, r.w = (float(v) for v in quat)
        self._tf.sendTransform(tf)

    def _publish_pose(self, header: Header, base_in_map: np.ndarray, rotation: np.ndarray,
                      covariance: np.ndarray) -> None:
        msg = PoseWithCovarianceStamped(header=header)
        position, quat = conversions.c2w_to_pose(base_in_map)
        p, o = msg.pose.pose.position, msg.pose.pose.orientation
        p.x, p.y, p.z = (float(v) for v in position)
        o.x, o.y, o.z, o.w = (float(v) for v in quat)
        if not covariance[:6, :6].any():  # no graph yet: unknown, never "exact" (all zero)
            msg.pose.covariance = np.diag([UNKNOWN_VARIANCE] * 6).reshape(-1).tolist()
        else:
            turn = np.zeros((6, 6))
            turn[:3, :3] = turn[3:, 3:] = rotation  # the graph's tangent is the camera's
            msg.pose.covariance = (turn @ covariance[:6, :6] @ turn.T).reshape(-1).tolist()
        self._pose_pub.publish(msg)

    def _refresh(self) -> None:
        """Timer: republish the path and markers when the graph or its edges changed."""
        self._publish_localized()
        with self._lock:
            closer, anchor = self._feed.closer, self._anchor
            if closer is None or anchor is None:
                return
            edges = closer.loop_edges()
            key = (closer.stats()['keyframes'], closer.version, len(edges))
            if key == self._published:
                return
            self._published = key
        self._publish_graph(closer.corrected_poses(), edges, *anchor)

    def _publish_graph(self, poses: np.ndarray, edges: list, anchor: np.ndarray,
                       mount_inv: np.ndarray) -> None:
        """Publish ``~/map_path`` and ``~/loop_closures``."""
        if not len(poses):
            return
        header = PoseStamped().header
        header.frame_id = self._map_frame
        closer = self._feed.closer  # its stamps include a loaded map's keyframes
        stamps = list(self._feed.stamps) if closer is None else closer.node_stamps().tolist()
        conversions.fill_stamp(header.stamp, stamps[len(poses) - 1]
                               if len(poses) <= len(stamps) else 0)
        in_map = [rigid(anchor @ pose) @ mount_inv for pose in poses]
        path = Path(header=header)
        for index, pose in enumerate(in_map):
            stamped = PoseStamped()
            stamped.header.frame_id = self._map_frame
            conversions.fill_stamp(stamped.header.stamp, stamps[index] if index < len(stamps)
                                   else 0)
            position, quat = conversions.c2w_to_pose(pose)
            p, o = stamped.pose.position, stamped.pose.orientation
            p.x, p.y, p.z = (float(v) for v in position)
            o.x, o.y, o.z, o.w = (float(v) for v in quat)
            path.poses.append(stamped)
        self._path_pub.publish(path)
        self._marker_pub.publish(self._markers(edges, in_map, header))

    def _markers(self, edges: list, in_map: list[np.ndarray], header: Header) -> MarkerArray:
        markers = MarkerArray()
        for marker_id, accepted in enumerate((True, False)):
            marker = Marker(header=header, ns='loop_closures', id=marker_id,
                            type=Marker.LINE_LIST, action=Marker.ADD)
            marker.scale.x = 0.02
            marker.pose.orientation.w = 1.0
            marker.color = _ACCEPTED if accepted else _REJECTED
            for edge in edges:
                if edge.accepted != accepted or max(edge.query, edge.candidate) >= len(in_map):
                    continue
                for index in (edge.candidate, edge.query):
                    x, y, z = (float(v) for v in in_map[index][:3, 3])
                    marker.points.append(Point(x=x, y=y, z=z))
            markers.markers.append(marker)
        return markers
