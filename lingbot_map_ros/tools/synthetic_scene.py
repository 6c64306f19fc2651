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
"""A procedural textured room and a camera looping through it, with exact poses.

The embedded default input of the demo and the end-to-end test: no downloads, deterministic from a
seed, and fast (a numpy ray caster: about 30 ms per 320x180 frame on one CPU core).

Scene (built in a z-up "room" frame, metres): an 8 x 6 x 2.6 m room whose six faces and three
boxes carry different procedural textures (value noise at two scales, a checkerboard, a colour
gradient) and a per-face shade, so every surface has corners and gradients a network can track.
The camera walks an ellipse around the centre box at about eye height, looking ahead and slightly
inwards, with a gentle height and pitch oscillation, and returns to its start after
``num_frames`` frames.

Poses are returned as ``c2w`` of the camera optical frame (x right, y down, z forward, as in
OpenCV and REP-103 ``*_optical_frame``) in a world frame **equal to the first camera**, the same
convention as the model's output (``model_spec.md`` section 6.3), so ground truth and predictions
can be plotted together; only the scale differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

# Room bounds in the z-up room frame: (min xyz, max xyz).
ROOM = (np.array([-4.0, -3.0, 0.0]), np.array([4.0, 3.0, 2.6]))
# Solid boxes on the floor: (min xyz, max xyz). All stay clear of the camera path.
BOXES = (
    (np.array([-0.6, -0.4, 0.0]), np.array([0.6, 0.4, 0.9])),
    (np.array([-3.9, 2.0, 0.0]), np.array([-3.0, 2.9, 1.6])),
    (np.array([2.9, -2.9, 0.0]), np.array([3.9, -2.1, 0.7])),
)
# Base colours (RGB, 0-1) cycled over the surfaces.
_PALETTE = np.array([
    [0.85, 0.55, 0.35], [0.35, 0.60, 0.85], [0.55, 0.80, 0.40], [0.90, 0.80, 0.45],
    [0.70, 0.45, 0.75], [0.45, 0.75, 0.75], [0.90, 0.45, 0.45], [0.60, 0.60, 0.60],
])
_NOISE_GRID = 64
LAP_RISE = 0.1
"""Metres each further lap of a multi-lap path runs above the previous one."""


@dataclass(frozen=True)
class SceneConfig:
    """Size, length and randomness of a synthetic sequence."""

    width: int = 320
    """Image width in pixels."""
    height: int = 180
    """Image height in pixels."""
    num_frames: int = 60
    """Frames in one loop around the room."""
    fps: float = 10.0
    """Frame rate that sets the stamps (``stamp = start + i / fps``)."""
    hfov_deg: float = 75.0
    """Horizontal field of view in degrees (square pixels, principal point at the centre)."""
    seed: int = 0
    """Seed of the textures (the geometry and the path are fixed)."""
    start_ns: int = 1_700_000_000_000_000_000
    """Stamp of the first frame, nanoseconds."""
    supersample: int = 1
    """Render at this factor and downsample with area averaging (anti-aliasing)."""
    laps: int = 1
    """Times the camera drives the loop (``num_frames`` each): later laps revisit the first
    one's places, rising :data:`LAP_RISE` m a lap (loop closure tests)."""

    def __post_init__(self) -> None:
        """Reject out-of-range values."""
        if self.width < 16 or self.height < 16:
            raise ValueError(f'scene size {self.width}x{self.height} must be at least 16x16')
        if self.num_frames < 1:
            raise ValueError(f'scene num_frames={self.num_frames} must be >= 1')
        if self.fps <= 0:
            raise ValueError(f'scene fps={self.fps} must be > 0')
        if not 10.0 <= self.hfov_deg <= 150.0:
            raise ValueError(f'scene hfov_deg={self.hfov_deg} must be in [10, 150]')
        if self.supersample < 1:
            raise ValueError(f'scene supersample={self.supersample} must be >= 1')
        if self.laps < 1:
            raise ValueError(f'scene laps={self.laps} must be >= 1')

    @property
    def total_frames(self) -> int:
        """Frames of the whole sequence (``num_frames * laps``)."""
        return self.num_frames * self.laps


@dataclass(frozen=True)
class SyntheticSequence:
    """Rendered frames with their exact cameras."""

    images: np.ndarray
    """[N, H, W, 3] uint8 RGB."""
    c2w: np.ndarray
    """[N, 4, 4] float64 camera optical frame in the world (= first camera) frame."""
    intrinsics: np.ndarray
    """[3, 3] float64 pinhole matrix of every frame."""
    stamps_ns: np.ndarray
    """[N] int64 stamps, nanoseconds."""
    depth: np.ndarray
    """[N, H, W] float32 z-depth in metres (same scale as ``c2w`` translations)."""


def pinhole_intrinsics(width: int, height: int, hfov_deg: float) -> np.ndarray:
    """Return the pinhole matrix with square pixels and the principal point at the image centre.

    Args:
        width: image width in pixels.
        height: image height in pixels.
        hfov_deg: horizontal field of view in degrees.

    Returns:
        [3, 3] float64 matrix ``[[f, 0, W/2], [0, f, H/2], [0, 0, 1]]``.
    """
    f = 0.5 * width / np.tan(np.radians(hfov_deg) / 2.0)
    return np.array([[f, 0.0, width / 2.0], [0.0, f, height / 2.0], [0.0, 0.0, 1.0]])


def camera_path(num_frames: int, laps: int = 1) -> np.ndarray:
    """Return the camera-to-room transforms of the loop, optical axes.

    Args:
        num_frames: number of poses a lap, evenly spaced in the loop parameter.
        laps: laps driven; each rises :data:`LAP_RISE` m (smoothly) above the one before.

    Returns:
        [num_frames * laps, 4, 4] float64 ``c2w`` in the z-up room frame.
    """
    poses = np.zeros((num_frames * laps, 4, 4))
    for i, phase in enumerate(2.0 * np.pi * np.arange(num_frames * laps) / num_frames):
        rise = LAP_RISE * i / num_frames if laps > 1 else 0.0
        centre = np.array([2.4 * np.cos(phase), 1.6 * np.sin(phase),
                           1.25 + 0.08 * np.sin(3.0 * phase) + rise])
        tangent = np.array([-2.4 * np.sin(phase), 1.6 * np.cos(phase), 0.0])
        inward = -centre[:2] / np.linalg.norm(centre[:2])
        heading = tangent[:2] / np.linalg.norm(tangent[:2]) + 0.6 * inward
        pitch = -0.18 + 0.05 * np.sin(2.0 * phase)
        forward = np.append(np.cos(pitch) * heading / np.linalg.norm(heading), np.sin(pitch))
        right = np.cross(forward, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        down = np.cross(forward, right)
        poses[i, :3, :3] = np.stack([right, down, forward], axis=1)
        poses[i, :3, 3] = centre
        poses[i, 3, 3] = 1.0
    return poses


class _Textures:
    """Seeded procedural textures, one per surface id, evaluated at surface coordinates."""

    def __init__(self, seed: int, num_surfaces: int) -> None:
        rng = np.random.default_rng(seed)
        self._noise = rng.random((num_surfaces, 2, _NOISE_GRID, _NOISE_GRID))
        self._checker_m = rng.uniform(0.25, 0.6, num_surfaces)
        self._colours = _PALETTE[rng.permutation(num_surfaces) % len(_PALETTE)]
        self._shade = rng.uniform(0.7, 1.0, num_surfaces)

    def _value_noise(self, sid: np.ndarray, octave: int, u: np.ndarray,
                     v: np.ndarray) -> np.ndarray:
        """Bilinearly interpolated lattice noise in [0, 1], tiling every 64 cells."""
        iu, iv = np.floor(u).astype(np.int64), np.floor(v).astype(np.int64)
        fu, fv = u - iu, v - iv
        g = _NOISE_GRID

        def at(du: int, dv: int) -> np.ndarray:
            return self._noise[sid, octave, (iv + dv) % g, (iu + du) % g]

        top = at(0, 0) * (1 - fu) + at(1, 0) * fu
        bottom = at(0, 1) * (1 - fu) + at(1, 1) * fu
        return top * (1 - fv) + bottom * fv

    def shade(self, sid: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """RGB in [0, 1] for hits on surfaces ``sid`` at surface coordinates (u, v) metres.

        Args:
            sid: [M] int surface ids.
            u: [M] first in-plane coordinate.
            v: [M] second in-plane coordinate.

        Returns:
            [M, 3] float64 colours.
        """
        coarse = self._value_noise(sid, 0, u * 1.5, v * 1.5)
        fine = self._value_noise(sid, 1, u * 9.0, v * 9.0)
        size = self._checker_m[sid]
        checker = (np.floor(u / size) + np.floor(v / size)) % 2
        gradient = 0.5 + 0.5 * np.sin(0.7 * u + 0.4 * v)
        light = 0.35 + 0.3 * coarse + 0.15 * fine + 0.2 * checker
        colour = self._colours[sid] * light[:, None]
        colour *= (0.75 + 0.25 * gradient)[:, None]
        return np.clip(colour * self._shade[sid][:, None], 0.0, 1.0)


def _cast(origin: np.ndarray, dirs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest hit of rays from inside the room, against the room and the boxes.

    Args:
        origin: [3] ray origin (room frame).
        dirs: [M, 3] ray directions, scaled so that the distance along a ray is z-depth.

    Returns:
        ``(t, surface id, axis of the hit face's normal)``, each [M]. Room faces are ids 0-5
        (axis * 2 + upper side), box b faces are ``6 + 6 * b + axis * 2 + side``.
    """
    with np.errstate(divide='ignore', invalid='ignore'):
        inv = 1.0 / dirs
        lo, hi = ROOM
        t_lo, t_hi = (lo - origin) * inv, (hi - origin) * inv
        t_exit = np.where(dirs > 0, t_hi, t_lo)
        t_exit[~np.isfinite(t_exit)] = np.inf
        axis = np.argmin(t_exit, axis=1)
        t = t_exit[np.arange(len(dirs)), axis]
        sid = axis * 2 + (dirs[np.arange(len(dirs)), axis] > 0)
        for b, (blo, bhi) in enumerate(BOXES):
            t0, t1 = (blo - origin) * inv, (bhi - origin) * inv
            near, far = np.minimum(t0, t1), np.maximum(t0, t1)
            near = np.nan_to_num(near, nan=-np.inf)
            far = np.nan_to_num(far, nan=np.inf)
            b_axis = np.argmax(near, axis=1)
            t_near = near[np.arange(len(dirs)), b_axis]
            hit = (t_near <= far.min(axis=1)) & (t_near > 1e-6) & (t_near < t)
            side = dirs[np.arange(len(dirs)), b_axis] < 0
            t = np.where(hit, t_near, t)
            axis = np.where(hit, b_axis, axis)
            sid = np.where(hit, 6 + 6 * b + b_axis * 2 + side, sid)
    return t, sid, axis


def _render(c2w_room: np.ndarray, k_inv: np.ndarray, size_hw: tuple[int, int],
            textures: _Textures) -> tuple[np.ndarray, np.ndarray]:
    """Render one view: ([H, W, 3] float RGB in [0, 1], [H, W] z-depth)."""
    h, w = size_hw
    us, vs = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    pix = np.stack([us.ravel(), vs.ravel(), np.ones(h * w)], axis=1)
    # Camera rays with z = 1, so the ray parameter at a hit is the z-depth.
    dirs = (pix @ k_inv.T) @ c2w_room[:3, :3].T
    origin = c2w_room[:3, 3]
    t, sid, axis = _cast(origin, dirs)
    hits = origin + t[:, None] * dirs
    # In-plane coordinates: the two axes other than the face normal.
    u_axis, v_axis = (axis + 1) % 3, (axis + 2) % 3
    rows = np.arange(len(t))
    rgb = textures.shade(sid, hits[rows, u_axis], hits[rows, v_axis])
    return rgb.reshape(h, w, 3), t.reshape(h, w)


def render_sequence(config: SceneConfig = SceneConfig(),
                    mount: np.ndarray | None = None) -> SyntheticSequence:
    """Render the loop: images, exact poses (world = first camera), intrinsics and stamps.

    Args:
        config: size, length, field of view, seed and stamps.
        mount: [4, 4] pose of this camera in the path's camera frame (a rig's other camera,
            ``synthetic_rig.py``); the world stays the path's first camera. None: identity.

    Returns:
        The rendered :class:`SyntheticSequence`.
    """
    k = pinhole_intrinsics(config.width, config.height, config.hfov_deg)
    s = config.supersample
    k_render = k.copy()
    k_render[:2] *= s
    k_inv = np.linalg.inv(k_render)
    textures = _Textures(config.seed, 6 + 6 * len(BOXES))
    path_room = camera_path(config.num_frames, config.laps)
    poses_room = path_room if mount is None else path_room @ mount
    size_hw = (config.height * s, config.width * s)
    images = np.zeros((config.total_frames, config.height, config.width, 3), np.uint8)
    depth = np.zeros((config.total_frames, config.height, config.width), np.float32)
    for i, pose in enumerate(poses_room):
        rgb, z = _render(pose, k_inv, size_hw, textures)
        small = cv2.resize(rgb.astype(np.float32), (config.width, config.height),
                           interpolation=cv2.INTER_AREA)
        images[i] = np.clip(np.rint(small * 255.0), 0, 255).astype(np.uint8)
        depth[i] = z[s // 2::s, s // 2::s]
    world_from_room = np.linalg.inv(path_room[0])
    step_ns = 1e9 / config.fps
    stamps = config.start_ns + np.rint(np.arange(config.total_frames) * step_ns).astype(np.int64)
    return SyntheticSequence(images=images, c2w=world_from_room @ poses_room, intrinsics=k,
                             stamps_ns=stamps, depth=depth)
