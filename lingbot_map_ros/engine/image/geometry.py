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
"""Pose encoding <-> cameras, intrinsics, and depth unprojection (spec §6.2, §7).

Dims: ``...`` any batch shape, H x W the processed image size, H0 x W0 the input image size.

Conventions (these hold everywhere in the engine):

- The 9-d pose encoding is ``[t_x, t_y, t_z, q_x, q_y, q_z, q_w, fov_h, fov_w]``: translation,
  a scalar-last (xyzw) quaternion that need not be unit length, and the vertical and horizontal
  fields of view in radians.
- ``E = [R | t]`` is **camera-to-world** (c2w): ``X_w = R X_c + t``, so ``t`` is the camera centre
  in the world frame. The official docstrings say "camera from world"; the way the official demo
  and viewer use the matrix makes it c2w.
- Camera axes are OpenCV, which are also ROS optical frame axes (REP 103): x right, y down,
  z forward. A ROS ``camera_optical_frame`` pose in the map frame is ``E`` itself.
- The world frame is nominally the first frame's camera. Translation and depth share one
  non-metric scale, fixed by the scale frames; nothing here rescales.
- Intrinsics are pinhole ``[[f_x, 0, c_x], [0, f_y, c_y], [0, 0, 1]]`` with ``c = (W/2, H/2)``,
  no skew, no distortion, for the *processed* image. Pixel coordinates are pixel-centre indices
  (pixel (u, v) is column u, row v; no +0.5), as the official unprojection uses them.

Special: the quaternion is normalised implicitly (``s = 2 / |q|^2``), so any non-zero q gives an
orthonormal R. A field of view of 0 (the network's ReLU can output it) would give an infinite focal
length; :func:`pose_encoding_to_intrinsics` clamps it (see there). Every public function takes
torch tensors or numpy arrays and returns the same kind.
"""

from __future__ import annotations

import math
from typing import TypeVar

from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
import numpy as np
import torch

Array = TypeVar('Array', torch.Tensor, np.ndarray)

DEFAULT_MIN_FOV_RAD = 1e-3
"""Smallest field of view the intrinsics accept; smaller values (and 0) are clamped to it."""


def _to_tensor(x: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, bool]:
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x), True
    if isinstance(x, torch.Tensor):
        return x, False
    raise ValueError(f'expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}')


def _like(result: torch.Tensor, as_numpy: bool) -> torch.Tensor | np.ndarray:
    return result.numpy() if as_numpy else result


def _upload(x: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Move a small host tensor to a CUDA device without a stream sync (pinned, async).

    A plain ``.to('cuda')`` of pageable memory waits for the device; the depth path runs
    between frames on the worker thread, where only the publishing copies may wait.
    """
    x = x.to(dtype)
    if device.type == 'cuda' and x.device.type == 'cpu':
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def _check_last_dims(x: torch.Tensor, dims: tuple[int, ...], what: str) -> None:
    if x.ndim < len(dims) or tuple(x.shape[x.ndim - len(dims):]) != dims:
        raise ValueError(f'{what}: expected shape [..., {", ".join(map(str, dims))}], '
                         f'got {list(x.shape)}')


def quaternion_to_rotation(quat: Array) -> Array:
    """Rotation matrices from scalar-last quaternions, normalised implicitly.

    Args:
        quat: [..., 4] ``(x, y, z, w)``, any non-zero length, finite.

    Returns:
        [..., 3, 3] rotation matrices (same dtype).

    Raises:
        ValueError: wrong shape, a zero or non-finite quaternion.
    """
    q, as_numpy = _to_tensor(quat)
    _check_last_dims(q, (4,), 'quaternion_to_rotation')
    norm2 = (q * q).sum(-1)
    if not bool(torch.isfinite(q).all()) or bool((norm2 == 0).any()):
        raise ValueError(f'quaternion_to_rotation: zero or non-finite quaternion in {q.tolist()}')
    x, y, z, w = q.unbind(-1)
    s = 2.0 / norm2
    rot = torch.stack([
        1 - s * (y * y + z * z), s * (x * y - z * w), s * (x * z + y * w),
        s * (x * y + z * w), 1 - s * (x * x + z * z), s * (y * z - x * w),
        s * (x * z - y * w), s * (y * z + x * w), 1 - s * (x * x + y * y),
    ], dim=-1)
    return _like(rot.reshape(q.shape[:-1] + (3, 3)), as_numpy)


def rotation_to_quaternion(rotation: Array) -> Array:
    """Convert rotation matrices to unit scalar-last quaternions (for ROS ``geometry_msgs``).

    Uses the numerically best of the four trace-based formulas per matrix, normalises, and picks
    the sign with ``w >= 0`` (q and -q are the same rotation).

    Args:
        rotation: [..., 3, 3] rotation matrices (a c2w ``R``).

    Returns:
        [..., 4] unit quaternions ``(x, y, z, w)`` with ``w >= 0``.

    Raises:
        ValueError: wrong shape.
    """
    r, as_numpy = _to_tensor(rotation)
    _check_last_dims(r, (3, 3), 'rotation_to_quaternion')
    m = [[r[..., i, j] for j in range(3)] for i in range(3)]
    diag = torch.stack([
        1 + m[0][0] - m[1][1] - m[2][2],  # 4 x^2
        1 - m[0][0] + m[1][1] - m[2][2],  # 4 y^2
        1 - m[0][0] - m[1][1] + m[2][2],  # 4 z^2
        1 + m[0][0] + m[1][1] + m[2][2],  # 4 w^2
    ], dim=-1)
    # Row c: 4 * q_c * (x, y, z, w) for the candidate built around component c.
    cand = torch.stack([
        torch.stack([diag[..., 0], m[0][1] + m[1][0], m[0][2] + m[2][0], m[2][1] - m[1][2]], -1),
        torch.stack([m[0][1] + m[1][0], diag[..., 1], m[1][2] + m[2][1], m[0][2] - m[2][0]], -1),
        torch.stack([m[0][2] + m[2][0], m[1][2] + m[2][1], diag[..., 2], m[1][0] - m[0][1]], -1),
        torch.stack([m[2][1] - m[1][2], m[0][2] - m[2][0], m[1][0] - m[0][1], diag[..., 3]], -1),
    ], dim=-2)
    best = diag.argmax(-1, keepdim=True)[..., None].expand(diag.shape[:-1] + (1, 4))
    quat = torch.gather(cand, -2, best).squeeze(-2)
    quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
    quat = torch.where(quat[..., 3:] < 0, -quat, quat)
    return _like(quat, as_numpy)


def pose_encoding_to_extrinsics(pose_enc: Array) -> Array:
    """Camera-to-world ``[R | t]`` from pose encodings.

    Args:
        pose_enc: [..., 9] ``[t(3), q_xyzw(4), fov_h, fov_w]``.

    Returns:
        [..., 3, 4] c2w extrinsics, same dtype (OpenCV / ROS optical camera axes).

    Raises:
        ValueError: wrong shape, or a zero / non-finite quaternion.
    """
    p, as_numpy = _to_tensor(pose_enc)
    _check_last_dims(p, (9,), 'pose_encoding_to_extrinsics')
    rot = quaternion_to_rotation(p[..., 3:7])
    return _like(torch.cat([rot, p[..., :3, None]], dim=-1), as_numpy)


def pose_encoding_to_intrinsics(pose_enc: Array, image_size_hw: tuple[int, int],
                                min_fov_rad: float = DEFAULT_MIN_FOV_RAD) -> Array:
    """Pinhole intrinsics of the processed image from the encoded fields of view.

    ``f_y = (H/2) / tan(fov_h/2)``, ``f_x = (W/2) / tan(fov_w/2)``, ``c = (W/2, H/2)``. Each field
    of view is first clamped to ``[min_fov_rad, pi - min_fov_rad]``: the network's ReLU can output
    exactly 0 (an infinite focal length) and nothing bounds it above pi (a negative one). With the
    default 1e-3 rad the largest focal length is about 1000 * W.

    Args:
        pose_enc: [..., 9] pose encodings; only ``[..., 7:9]`` is read.
        image_size_hw: (H, W) of the processed image.
        min_fov_rad: clamp bound, in (0, pi/2).

    Returns:
        [..., 3, 3] intrinsics in the dtype of ``pose_enc`` (the official code builds them in
        float32; the values agree to float32 rounding).

    Raises:
        ValueError: wrong shape, bad image size or ``min_fov_rad``, or a non-finite FoV.
    """
    p, as_numpy = _to_tensor(pose_enc)
    _check_last_dims(p, (9,), 'pose_encoding_to_intrinsics')
    height, width = image_size_hw
    if height < 1 or width < 1:
        raise ValueError(f'pose_encoding_to_intrinsics: bad image_size_hw={image_size_hw}')
    if not 0 < min_fov_rad < math.pi / 2:
        raise ValueError(f'min_fov_rad={min_fov_rad} must be in (0, pi/2)')
    fov = p[..., 7:9]
    if not bool(torch.isfinite(fov).all()):
        raise ValueError(f'pose_encoding_to_intrinsics: non-finite FoV in {fov.tolist()}')
    fov = fov.clamp(min_fov_rad, math.pi - min_fov_rad)
    f_y = (height / 2.0) / torch.tan(fov[..., 0] / 2.0)
    f_x = (width / 2.0) / torch.tan(fov[..., 1] / 2.0)
    k = torch.zeros(p.shape[:-1] + (3, 3), dtype=p.dtype, device=p.device)
    k[..., 0, 0] = f_x
    k[..., 1, 1] = f_y
    k[..., 0, 2] = width / 2.0
    k[..., 1, 2] = height / 2.0
    k[..., 2, 2] = 1.0
    return _like(k, as_numpy)


def to_c2w_4x4(extrinsics: Array) -> Array:
    """Homogeneous 4x4 form of ``[R | t]`` (bottom row ``[0, 0, 0, 1]``).

    Args:
        extrinsics: [..., 3, 4] c2w extrinsics.

    Returns:
        [..., 4, 4] c2w transforms, same dtype.

    Raises:
        ValueError: wrong shape.
    """
    e, as_numpy = _to_tensor(extrinsics)
    _check_last_dims(e, (3, 4), 'to_c2w_4x4')
    bottom = torch.zeros(e.shape[:-2] + (1, 4), dtype=e.dtype, device=e.device)
    bottom[..., 0, 3] = 1.0
    return _like(torch.cat([e, bottom], dim=-2), as_numpy)


def intrinsics_for_original(intrinsics: Array, info: PreprocessInfo) -> Array:
    """Intrinsics of the input image, undoing the crop-mode resize and row crop.

    PIL's resize maps image corners to corners, so in pixel-centre indices the processed pixel u
    sits at input column ``(u + 0.5) / s_x - 0.5`` and row v at
    ``(v + crop_top + 0.5) / s_y - 0.5``. Hence ``f_x / s_x``, ``f_y / s_y`` and
    ``c_x' = (c_x + 0.5) / s_x - 0.5``, ``c_y' = (c_y + crop_top + 0.5) / s_y - 0.5``.

    Args:
        intrinsics: [..., 3, 3] intrinsics of the processed image.
        info: the :class:`PreprocessInfo` of that image.

    Returns:
        [..., 3, 3] intrinsics for the (EXIF-transposed) input image, same dtype.

    Raises:
        ValueError: wrong shape.
    """
    k, as_numpy = _to_tensor(intrinsics)
    _check_last_dims(k, (3, 3), 'intrinsics_for_original')
    sx, sy = info.scale_x, info.scale_y
    to_original = torch.tensor([[1.0 / sx, 0.0, 0.5 / sx - 0.5],
                                [0.0, 1.0 / sy, (info.crop_top + 0.5) / sy - 0.5],
                                [0.0, 0.0, 1.0]], dtype=k.dtype, device=k.device)
    return _like(to_original @ k, as_numpy)


def unproject_depth(depth: Array, intrinsics: Array, c2w: Array,
                    dtype: torch.dtype | None = None) -> Array:
    """World points of a depth map: ``X_w = R (d K^-1 [u, v, 1]^T) + t``.

    Depth is the z-coordinate in the camera frame (not the ray length); (u, v) is the pixel
    column / row index with no +0.5 (spec §7). Output is in the same non-metric scale as depth.
    The points are computed on the depth's device; ``K`` is inverted where it lives (a numpy
    ``K`` on the host: no device sync), and the small matrices then move to that device without
    waiting for it (:func:`_upload`).

    Args:
        depth: [..., H, W] depth maps.
        intrinsics: [..., 3, 3] intrinsics of the processed image.
        c2w: [..., 3, 4] or [..., 4, 4] camera-to-world transforms.
        dtype: floating dtype of the computation and the result; default the promoted dtype of
            the inputs.

    Returns:
        [..., H, W, 3] world points.

    Raises:
        ValueError: wrong shapes.
    """
    d, as_numpy = _to_tensor(depth)
    k, _ = _to_tensor(intrinsics)
    e, _ = _to_tensor(c2w)
    _check_last_dims(k, (3, 3), 'unproject_depth intrinsics')
    if d.ndim < 2 or e.ndim < 2 or e.shape[-1] != 4 or e.shape[-2] not in (3, 4):
        raise ValueError(f'unproject_depth: bad shapes depth {list(d.shape)}, '
                         f'c2w {list(e.shape)} (want [..., H, W] and [..., 3|4, 4])')
    if dtype is None:
        dtype = torch.promote_types(torch.promote_types(d.dtype, k.dtype), e.dtype)
    k_inv = _upload(torch.linalg.inv(k.to(torch.promote_types(k.dtype, dtype))), d.device, dtype)
    height, width = d.shape[-2:]
    v, u = torch.meshgrid(torch.arange(height, dtype=dtype, device=d.device),
                          torch.arange(width, dtype=dtype, device=d.device), indexing='ij')
    pixels = torch.stack([u, v, torch.ones_like(u)], dim=-1)  # [H, W, 3]
    rays = torch.einsum('...ij,hwj->...hwi', k_inv, pixels)
    cam = rays * d.to(dtype)[..., None]
    e = _upload(e, d.device, dtype)
    rot, trans = e[..., :3, :3], e[..., :3, 3]
    world = torch.einsum('...ij,...hwj->...hwi', rot, cam) + trans[..., None, None, :]
    return _like(world, as_numpy)
