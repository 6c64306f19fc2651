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
"""Publishers of the node's outputs, all stamped with the input image's stamp.

Frames (REP 105, docs/odometry.md, ``odom_frames.py``): poses, path, odometry and TF are those
of ``frames.base_frame`` in ``frames.odom_frame``, which is anchored at the first pose after
start or a reset and stays continuous across session rollovers. TF ``odom -> base_frame`` only;
with ``frames.map_frame`` set and loop closure off, also a static identity ``map -> odom``
(with loop closure ``loop_outputs.py`` broadcasts the pose graph's). Translation, depth and the
cloud share one scale: metres with a depth camera (``metric.source: depth``), else the model's,
fixed by the first session's scale frames and carried across rollovers. The model gives no
uncertainty: odometry covariances are marked unknown with a large variance
(:data:`UNKNOWN_VARIANCE`, as rtabmap does when lost) on the diagonal, never all zero (which
filters read as exact). With an IMU (:meth:`Outputs.use_covariance`) the pose covariance is the
dead-reckoning one instead (``engine/imu/odometry_covariance.py``: the gyroscope's rotation
noise and a per-distance translation noise compounded frame to frame, from zero at the anchor,
in odom's axes, x y z roll pitch yaw); the twist's stays unknown. The twist is a finite
difference of consecutive poses, in ``base_frame``, in odom units per second.

With an IMU that levels ``map`` (docs/imu.md, Frames) the static ``map -> odom`` is re-sent
with that levelling (:meth:`Outputs.follow_map_level`).
"""

from __future__ import annotations

import collections
from typing import Any

from geometry_msgs.msg import PoseStamped, TransformStamped
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.ros.messages import conversions
from lingbot_map_ros.ros.parameters.node_options import NodeOptions
from lingbot_map_ros.ros.publishers.odom_frames import lookup_mount, OdomFrames
from nav_msgs.msg import Odometry, Path
import numpy as np
from rclpy.publisher import Publisher
from rclpy.qos import QoSProfile
from sensor_msgs.msg import CameraInfo, Image, PointCloud2, PointField

try:  # tf2_ros comes with a ROS install, not with the PyPI wheels.
    from tf2_ros import Buffer, StaticTransformBroadcaster, TransformBroadcaster
    from tf2_ros import TransformListener
except ImportError:  # pragma: no cover - depends on the machine
    TransformBroadcaster = None

UNKNOWN_VARIANCE = 9999.0
"""Diagonal of the odometry pose and twist covariances: the model estimates none."""
_UNKNOWN_COVARIANCE = np.diag([UNKNOWN_VARIANCE] * 6).reshape(-1).tolist()

# 'rgb' is FLOAT32 holding 0x00RRGGBB bits, as pcl::PointXYZRGB and RViz expect.
_CLOUD_FIELDS = [PointField(name=n, offset=4 * i, datatype=PointField.FLOAT32, count=1)
                 for i, n in enumerate(('x', 'y', 'z', 'rgb'))]


class Outputs:
    """Owns the output publishers, the bounded path and the previous pose (for the twist)."""

    def __init__(self, node: Any, values: dict[str, Any], stats: Any = None, *,
                 prefix: str = '~/', broadcast_tf: bool = True, aligner: Any = None) -> None:
        """Create every output publisher (optional outputs are created too and stay silent).

        Args:
            node: the ``rclpy`` node.
            values: parameter values; ``frames.*`` are read once here.
            stats: the node's ``NodeStats``, counting the non-finite numbers kept off the
                topics (``count_nonfinite``); None counts nothing (tools, tests).
            prefix: of the topics (``~/<camera>/`` for one camera of several).
            broadcast_tf: broadcast ``odom -> base_frame`` (and ``map -> odom``); the cameras
                of several leave it to the fused odometry.
            aligner: with several cameras, maps this camera's base pose into the node's odom
                (``aligned(pred, base_pose)``, ``odom_from_own_odom()``); None: identity.

        Raises:
            ValueError: a bad ``frames.base_to_camera``.
        """
        self._node = node
        self._stats = stats
        self._odom_frame = values['frames.odom_frame']
        self._base_frame = values['frames.base_frame']
        self._frames = OdomFrames(values['frames.base_to_camera'])
        self._tf_buffer = None
        self._aligner = aligner
        reliable = QoSProfile(depth=10)
        self._pose_pub = node.create_publisher(PoseStamped, prefix + 'pose', reliable)
        self._odom_pub = node.create_publisher(Odometry, prefix + 'odometry', reliable)
        self._path_pub = node.create_publisher(Path, prefix + 'path', QoSProfile(depth=1))
        # 'depth/image' beside 'depth/camera_info': the pair image_transport tools expect.
        self._depth_pub = node.create_publisher(Image, prefix + 'depth/image',
                                                QoSProfile(depth=2))
        self._info_pub = node.create_publisher(CameraInfo, prefix + 'depth/camera_info',
                                               QoSProfile(depth=2))
        self._cloud_pub = node.create_publisher(PointCloud2, prefix + 'cloud',
                                                QoSProfile(depth=2))
        self._tf = TransformBroadcaster(node) \
            if TransformBroadcaster is not None and broadcast_tf else None
        if TransformBroadcaster is not None:
            self._tf_buffer = Buffer()
            try:  # only /tf_static where tf2_ros offers it: the mounting is static
                self._tf_listener = TransformListener(self._tf_buffer, node, spin_thread=False,
                                                      static_only=True)
            except TypeError:  # pragma: no cover - older tf2_ros
                self._tf_listener = TransformListener(self._tf_buffer, node, spin_thread=False)
        self._static_map: TransformStamped | None = None  # re-sent levelled (follow_map_level)
        if self._tf is not None:
            self._static_tf = StaticTransformBroadcaster(node)
            # With loop closure the map -> odom correction is ours (loop_outputs.py).
            if values['frames.map_frame'] and values.get('publish.map_tf', True) and \
                    not values.get('loop.enable', False):
                identity = TransformStamped(child_frame_id=self._odom_frame)
                identity.header.frame_id = values['frames.map_frame']
                identity.header.stamp = node.get_clock().now().to_msg()
                identity.transform.rotation.w = 1.0
                self._static_tf.sendTransform(identity)
                self._static_map = identity
        self._path: collections.deque[PoseStamped] = collections.deque(maxlen=1000)
        self._prev: tuple[int, np.ndarray] | None = None
        self._map_level: tuple[OdomFrames, int] | None = None  # follow_map_level
        self._covariance: Any = None

    def use_covariance(self, source: Any) -> None:
        """Take ``~/odometry``'s pose covariance from ``source`` (an ``OdometryCovariance``).

        ``source.step(stamp_ns, base_in_odom, base_from_camera)`` gives each frame's [6, 6];
        ``source.reset()`` is called at each new anchor (:meth:`clear`). None: unknown again.
        """
        self._covariance = source

    @property
    def has_tf(self) -> bool:
        """Return True when tf2_ros is importable and TF can be broadcast."""
        return self._tf is not None

    @property
    def frames(self) -> OdomFrames:
        """Return the odom frame of the poses (other outputs in that frame share it)."""
        return self._frames

    def use_tf_buffer(self, buffer: Any) -> None:
        """Look the camera mounting up in ``buffer`` (a tf2 ``Buffer`` or one like it).

        It is read at the next anchor (the first frame, or the first after a reset).
        """
        self._tf_buffer = buffer

    def frames_info(self) -> dict[str, str]:
        """``odom_frame``, ``base_frame`` and where the mounting came from, for diagnostics."""
        return {'odom_frame': self._odom_frame, 'base_frame': self._base_frame,
                'mounting': 'tf_static' if self._frames.mount_from_tf else 'parameter'}

    def destroy(self) -> None:
        """Destroy every publisher (lifecycle cleanup); the object is unusable afterwards."""
        for value in list(vars(self).values()):
            if isinstance(value, Publisher):
                self._node.destroy_publisher(value)
        for broadcaster in (self._tf, getattr(self, '_static_tf', None)):
            if broadcaster is not None:
                self._node.destroy_publisher(broadcaster.pub_tf)
        if getattr(self, '_tf_listener', None) is not None:
            self._tf_listener.unregister()

    def clear(self) -> int:
        """Forget the path, the previous pose and the odom origin (on reset).

        Returns:
            The poses cleared from the path.
        """
        count = len(self._path)
        self._path.clear()
        self._prev = None
        self._frames.clear()
        if self._covariance is not None:
            self._covariance.reset()
        return count

    def publish(self, pred: FramePrediction, camera_frame: str, opts: NodeOptions) -> None:
        """Publish every enabled output for one prediction.

        Args:
            pred: the engine's prediction (its ``c2w`` must be finite).
            camera_frame: frame_id of the image (depth image; mounting lookup).
            opts: current node options (what to publish).

        Raises:
            ValueError: non-finite pose (nothing is published).
        """
        if not np.isfinite(pred.c2w).all():
            raise ValueError(f'frame {pred.frame_index}: non-finite pose')
        if not self._frames.anchored:
            self._read_mount(camera_frame)
        c2w = self._frames.base_in_odom(pred.c2w, pred.stamp_ns)
        if self._aligner is not None:
            c2w = self._aligner.aligned(pred, c2w)
        header = self.publish_base(c2w, pred.stamp_ns, opts)
        if pred.depth is not None and opts.publish_depth:
            self._publish_depth(pred, header, camera_frame)
        if pred.depth is not None and opts.publish_cloud:
            self._publish_cloud(pred, header, opts.cloud_stride)

    def publish_base(self, c2w: np.ndarray, stamp_ns: int, opts: NodeOptions) -> Any:
        """Publish pose, odometry, path and TF of a ``base_frame`` pose in odom.

        Returns:
            The header of the published pose.
        """
        position, quat = conversions.c2w_to_pose(c2w)
        pose = PoseStamped()
        pose.header.frame_id = self._odom_frame
        conversions.fill_stamp(pose.header.stamp, stamp_ns)
        p, o = pose.pose.position, pose.pose.orientation
        p.x, p.y, p.z = position
        o.x, o.y, o.z, o.w = quat
        self._pose_pub.publish(pose)
        self._publish_odometry(pose, c2w, stamp_ns)
        self._publish_path(pose, opts.path_max_poses)
        if opts.publish_tf and self._tf is not None:
            self._publish_tf(pose)
        if self._map_level is not None:
            self._send_map_level()
        return pose.header

    def follow_map_level(self, frames: OdomFrames) -> None:
        """Re-send the static ``map -> odom`` with ``frames``' gravity levelling when it changes.

        Only where this object broadcasts the static identity (``frames.map_frame`` set, loop
        closure off); ``frames`` is the primary camera's (docs/imu.md, Frames).
        """
        if self._static_map is not None:
            self._map_level = (frames, frames.map_level_version)

    def _send_map_level(self) -> None:
        frames, sent = self._map_level
        version = frames.map_level_version
        if version == sent:
            return
        self._map_level = (frames, version)
        _, quat = conversions.c2w_to_pose(frames.map_level())
        r = self._static_map.transform.rotation
        r.x, r.y, r.z, r.w = (float(v) for v in quat)
        self._static_map.header.stamp = self._node.get_clock().now().to_msg()
        self._static_tf.sendTransform(self._static_map)

    def odom_from_world(self) -> np.ndarray:
        """``T_odom_world`` of this camera's engine world (a similarity with several cameras)."""
        own = self._frames.odom_from_world()
        return own if self._aligner is None else self._aligner.odom_from_own_odom() @ own

    def _read_mount(self, camera_frame: str) -> None:
        """Take the mounting from /tf_static when it is there (once, before the first anchor).

        A transform that is not a plausible mounting is refused and the mounting in use kept.
        """
        if self._tf_buffer is None or self._frames.mount_from_tf:
            return
        try:
            mount = lookup_mount(self._tf_buffer, self._base_frame, camera_frame)
        except ValueError as exc:
            self._node.get_logger().warning(
                f'camera mounting refused: {exc}; keeping frames.base_to_camera',
                throttle_duration_sec=60.0)
            return
        if mount is not None:
            self._frames.set_mount_from_tf(mount)
            self._node.get_logger().info(
                f'camera mounting {self._base_frame} -> {camera_frame} read from TF; '
                'frames.base_to_camera is not used')

    def _publish_odometry(self, pose: PoseStamped, c2w: np.ndarray, stamp_ns: int) -> None:
        odom = Odometry(header=pose.header, child_frame_id=self._base_frame)
        odom.pose.pose = pose.pose
        odom.pose.covariance = odom.twist.covariance = _UNKNOWN_COVARIANCE
        if self._covariance is not None:
            cov = self._covariance.step(stamp_ns, c2w, self._frames.mount)
            if self._finite('odometry_covariance', 1, cov):
                odom.pose.covariance = np.asarray(cov, np.float64).reshape(-1).tolist()
        if self._prev is not None and stamp_ns > self._prev[0]:
            linear, angular = conversions.twist_between(self._prev[1], c2w,
                                                        (stamp_ns - self._prev[0]) * 1e-9)
            if not self._finite('odometry_twist', 1, linear, angular):
                linear = angular = np.zeros(3)  # unknown, as the covariance already says
            t = odom.twist.twist
            t.linear.x, t.linear.y, t.linear.z = (float(v) for v in linear)
            t.angular.x, t.angular.y, t.angular.z = (float(v) for v in angular)
        self._prev = (stamp_ns, c2w)
        self._odom_pub.publish(odom)

    def _publish_path(self, pose: PoseStamped, max_poses: int) -> None:
        if max_poses <= 0:
            self._path.clear()
            return
        if self._path.maxlen != max_poses:
            self._path = collections.deque(self._path, maxlen=max_poses)
        self._path.append(pose)
        self._path_pub.publish(Path(header=pose.header, poses=list(self._path)))

    def _publish_tf(self, pose: PoseStamped) -> None:
        tf = TransformStamped(header=pose.header, child_frame_id=self._base_frame)
        p, t = pose.pose.position, tf.transform.translation
        t.x, t.y, t.z = p.x, p.y, p.z
        tf.transform.rotation = pose.pose.orientation
        self._tf.sendTransform(tf)

    def _finite(self, kind: str, num: int, *arrays: np.ndarray) -> bool:
        """Return True when every value is finite, else count ``num`` under ``kind`` and log."""
        if all(np.isfinite(a).all() for a in arrays):
            return True
        if self._stats is not None:
            self._stats.count_nonfinite(kind, num)
        self._node.get_logger().warning(f'non-finite numbers kept off the outputs ({kind})',
                                        throttle_duration_sec=10.0)
        return False

    def _publish_depth(self, pred: FramePrediction, header: Any, camera_frame: str) -> None:
        k = np.asarray(pred.intrinsics, np.float64)
        if not self._finite('depth_camera_info', 1, k):
            return
        # The one host copy, a new array: bad pixels are zeroed in it.
        depth = np.array(pred.depth.cpu().numpy(), dtype='<f4')
        bad = ~np.isfinite(depth)
        if bad.any():
            # 0 is "no depth" to the cloud and the map; NaN/inf would reach subscribers.
            self._finite('depth_pixels', int(bad.sum()), depth)
            depth[bad] = 0.0
        height, width = depth.shape
        img = Image(height=height, width=width, encoding='32FC1', is_bigendian=0,
                    step=4 * width)
        img.header.stamp, img.header.frame_id = header.stamp, camera_frame
        img.data = depth.tobytes()
        info = CameraInfo(header=img.header, height=height, width=width,
                          distortion_model='plumb_bob', d=[0.0] * 5)
        info.k = k.reshape(-1).tolist()
        info.r = np.eye(3).reshape(-1).tolist()
        info.p = np.hstack([k, np.zeros((3, 1))]).reshape(-1).tolist()
        self._depth_pub.publish(img)
        self._info_pub.publish(info)

    def _publish_cloud(self, pred: FramePrediction, header: Any, stride: int) -> None:
        # The unprojection into odom is the prediction's one, shared with ~/map (map_output).
        points, rgb, valid = pred.host_cloud(self.odom_from_world(), stride)
        num, data = conversions.xyz_rgb_cloud(points, rgb, 1, valid=valid)
        cloud = PointCloud2(header=header, height=1, width=num, fields=_CLOUD_FIELDS,
                            is_bigendian=False, point_step=16, row_step=16 * num,
                            is_dense=True)
        cloud.data = data
        self._cloud_pub.publish(cloud)
