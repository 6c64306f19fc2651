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
"""What the streaming session returns for each frame.

Conventions (see ``geometry.py``): ``c2w`` maps camera coordinates to world coordinates, camera
axes are OpenCV / ROS optical (x right, y down, z forward), the world frame is nominally the first
frame's camera, and translation and depth share one scale fixed by the scale frames (metres
when a depth camera sets it: ``engine/session/metric_session.py``).

Dense outputs (``depth``, ``depth_conf``, ``image``) stay torch tensors on the engine's device:
only what a message needs is copied to the host, where it is published. :meth:`points` unprojects
the depth once per prediction and target frame, so ``~/cloud`` and ``~/map`` (or the replay's
map) share one unprojection; :meth:`host_cloud` brings a strided cloud to the host in one copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lingbot_map_ros.engine.errors import NonFiniteOutputError
from lingbot_map_ros.engine.frames import FrameTag, Role
from lingbot_map_ros.engine.image import geometry
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
from lingbot_map_ros.engine.model.place_descriptor import start_host_copy
import numpy as np
import torch

__all__ = ['FramePrediction', 'FrameTag', 'Role']


@dataclass(frozen=True, slots=True)
class FramePrediction:
    """Per-frame output of :class:`lingbot_map_ros.engine.session.pipeline.StreamingSession`."""

    frame_index: int
    """0-based index of the frame since the last reset."""
    tag: FrameTag
    """The tag the caller gave with the frame, returned unchanged (the same object)."""
    role: Role
    """'scale' (first N_s frames, run together), 'keyframe' (cached) or 'non-keyframe'."""
    time_index: int
    """3-D RoPE time index the frame used (number of keyframes cached before it)."""
    pose_enc: np.ndarray
    """[9] float64: translation(3), quaternion xyzw(4), fov_h, fov_w (radians)."""
    c2w: np.ndarray
    """[4, 4] float64 camera-to-world transform (rotation normalised). Behind a
    :class:`~lingbot_map_ros.engine.session.rollover.RolloverSession` this is the continuous pose,
    stitched across rollovers; ``session_c2w`` keeps the session's own."""
    intrinsics: np.ndarray
    """[3, 3] float64 pinhole matrix for the processed image (``image_size_hw``)."""
    intrinsics_original: np.ndarray
    """[3, 3] float64 pinhole matrix for the original input image (``original_size_hw``)."""
    preprocess: PreprocessInfo
    """How the processed image relates to the input image."""
    network_input: torch.Tensor
    """[3, H, W] float image in [0, 1] the network ran on, on the engine's device (the
    rollover keeps keyframes' for its overlap instead of uploading them again)."""
    depth: torch.Tensor | None = None
    """[H, W] float32 depth along z for the processed image on the engine's device, or None:
    model units, metres behind a metric
    :class:`~lingbot_map_ros.engine.session.rollover.RolloverSession`."""
    depth_conf: torch.Tensor | None = None
    """[H, W] float32 confidence (>= 1) on the engine's device, or None."""
    image: torch.Tensor | None = None
    """[H, W, 3] uint8 processed RGB image on the engine's device (for colouring points), or
    None (no depth)."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Wall-clock milliseconds per stage ('preprocess', 'model', 'total', ...)."""
    session: int = 0
    """Engine session that made the prediction (counts rollovers and resets)."""
    session_c2w: np.ndarray | None = None
    """[4, 4] pose in the session's own frame, before stitching; None when not stitched."""
    descriptor: np.ndarray | None = None
    """[C] float32 L2-normalised place descriptor of a keyframe (``model/place_descriptor.py``),
    on the host; None for non-keyframes and unless the session asks for them
    (``StreamingSession.place_descriptors``)."""
    _points: list = field(default_factory=list, init=False, repr=False, compare=False)
    """``[frame_from_world, points]`` of the last :meth:`points` call (``replace`` empties it)."""

    @property
    def stamp_ns(self) -> int:
        """Return the frame's timestamp in nanoseconds (``tag.stamp_ns``)."""
        return self.tag.stamp_ns

    @property
    def image_size_hw(self) -> tuple[int, int]:
        """Return (H, W) of the processed image the network saw."""
        return self.preprocess.image_size_hw

    @property
    def original_size_hw(self) -> tuple[int, int]:
        """Return (H, W) of the input image."""
        return self.preprocess.original_size_hw

    @property
    def is_keyframe(self) -> bool:
        """Return True for frames whose K/V stay in the cache (scale frames and keyframes)."""
        return self.role != 'non-keyframe'

    def points(self, frame_from_world: np.ndarray) -> torch.Tensor:
        """Unproject the depth into a frame, once per prediction and frame.

        Args:
            frame_from_world: [4, 4] transform from the world frame of ``c2w`` into the target
                frame (the node's odom frame, the replay's map axes).

        Returns:
            [H, W, 3] float32 points on the depth's device (NaN where the depth is); the same
            tensor for every call with an equal transform.

        Raises:
            ValueError: no depth, or a non-finite pose.
        """
        if self.depth is None:
            raise ValueError(f'frame {self.frame_index}: no depth to unproject')
        key = np.asarray(frame_from_world, np.float64)
        if self._points and np.array_equal(self._points[0], key):
            return self._points[1]
        pose = key @ self.c2w
        if not (np.isfinite(pose).all() and np.isfinite(self.intrinsics).all()):
            raise ValueError(f'frame {self.frame_index}: non-finite pose or intrinsics')
        points = geometry.unproject_depth(self.depth, self.intrinsics, pose, dtype=torch.float32)
        self._points[:] = [key.copy(), points]
        return points

    def host_cloud(self, frame_from_world: np.ndarray, stride: int
                   ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Every ``stride``-th row and column of :meth:`points`, on the host in one copy.

        Args:
            frame_from_world: as for :meth:`points`.
            stride: keep every ``stride``-th row and column (>= 1).

        Returns:
            ``([h, w, 3] float32 points, [h, w, 3] uint8 colours or None, [h, w] bool depth > 0)``.
        """
        step = slice(None, None, stride)
        parts = [self.points(frame_from_world)[step, step],
                 (self.depth[step, step] > 0).to(torch.float32)[..., None]]
        if self.image is not None:
            parts.append(self.image[step, step].to(torch.float32))
        host = torch.cat(parts, dim=-1).cpu().numpy()
        rgb = host[..., 4:7].astype(np.uint8) if self.image is not None else None
        return host[..., :3], rgb, host[..., 3] > 0


def host_maps(maps: list[torch.Tensor]) -> np.ndarray:
    """Return ``[N, H, W]`` float32 on the host from per-frame device maps, in one copy."""
    return torch.stack(maps).float().cpu().numpy()


def frame_prediction(out: dict[str, torch.Tensor], row: int, index: int, role: Role,
                     time_index: int, info: PreprocessInfo, tag: FrameTag, image: torch.Tensor,
                     timings: dict[str, float]) -> FramePrediction:
    """Make row ``row`` of a model call's outputs ``out`` a frame's prediction.

    The pose is the one host copy per frame; dense outputs stay on the device. They are copied
    there (no sync): the model's output buffers are reused by the next frame. A place
    descriptor in ``out`` (keyframes of a session that asks) is copied to the host without a
    wait of its own: queued before the pose's copy, it is complete when that returns.
    """
    descriptor = (start_host_copy(out['descriptor'][row]) if 'descriptor' in out else None)
    pose_enc = out['pose_enc'][row].detach().double().cpu().numpy()
    depth = conf = rgb = None
    if 'depth' in out:
        depth = out['depth'][row].detach().to(torch.float32, copy=True)
        conf = out['depth_conf'][row].detach().to(torch.float32, copy=True)
        rgb = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
        rgb = rgb.permute(1, 2, 0)
    c2w = k = k_orig = np.full((4, 4), np.nan)
    if np.isfinite(pose_enc).all():
        c2w = geometry.to_c2w_4x4(geometry.pose_encoding_to_extrinsics(pose_enc))
        k = geometry.pose_encoding_to_intrinsics(pose_enc, info.image_size_hw)
        k_orig = geometry.intrinsics_for_original(k, info)
    timings = dict(timings, total=sum(timings.values()))
    return FramePrediction(
        frame_index=index, tag=tag, role=role, time_index=time_index,
        pose_enc=pose_enc, c2w=c2w, intrinsics=k, intrinsics_original=k_orig,
        preprocess=info, network_input=image, depth=depth, depth_conf=conf, image=rgb,
        timings_ms=timings,
        # A copy: the pinned buffer goes back to torch's cache for the next keyframe's.
        descriptor=None if descriptor is None else descriptor.numpy().copy())


def check_finite(preds: list[FramePrediction]) -> None:
    """Raise :class:`NonFiniteOutputError` for the first prediction with a non-finite pose."""
    for pred in preds:
        if not np.isfinite(pred.pose_enc).all():
            raise NonFiniteOutputError(
                f'frame {pred.frame_index} ({pred.role}) has a non-finite pose encoding '
                f'{pred.pose_enc.tolist()}; reset the session')


def with_timing(preds: list[FramePrediction], key: str,
                ms: float | None) -> list[FramePrediction]:
    """Return ``preds`` with ``timings_ms[key] = ms`` (as they are when ``ms`` is None)."""
    if ms is None:
        return preds
    return [replace(p, timings_ms=dict(p.timings_ms, **{key: ms})) for p in preds]
