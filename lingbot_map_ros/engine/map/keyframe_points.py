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
"""Which pixels of a keyframe go into a map, and the voxel keys of points.

Shared by :class:`~lingbot_map_ros.engine.map.map_accumulator.MapAccumulator` (the odom map)
and :class:`~lingbot_map_ros.engine.map.anchored_map.AnchoredMap` (the loop-closed map), so
both keep the same pixels (and the live settings and keyframe placement they share with the
occupancy grid): every ``map.pixel_stride``-th pixel whose depth is finite and
positive and whose confidence passes ``map.min_confidence`` and the keyframe's
``map.confidence_percentile``.

Voxel keys pack the three integer voxel coordinates into one int64 (21 bits each); a point
farther than ``2**20`` voxels from the origin on some axis has no key.
"""

from __future__ import annotations

from typing import Iterable, Protocol

from lingbot_map_ros.config import MapConfig
from lingbot_map_ros.engine import sim3
import numpy as np
import torch

KEY_BITS = 21
"""Bits per axis of a voxel key."""
_OFFSET = 1 << (KEY_BITS - 1)


def as_tensor(x: torch.Tensor | np.ndarray, device: torch.device, dtype: torch.dtype
              ) -> torch.Tensor:
    """Return ``x`` as a tensor of ``dtype`` on ``device``."""
    return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x,
                           device=device).to(dtype)


def keyframe_points(points: torch.Tensor | np.ndarray, depth: torch.Tensor | np.ndarray,
                    confidence: torch.Tensor | np.ndarray | None,
                    rgb: torch.Tensor | np.ndarray | None, config: MapConfig,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Return a keyframe's points that pass the stride, depth and confidence filters.

    Args:
        points: [H, W, 3] points of every pixel (in whatever frame the caller wants them).
        depth: [H, W] z-depth of those pixels (which ones are valid).
        confidence: [H, W] depth confidence, or None (no confidence filter).
        rgb: [H, W, 3] uint8 colours, or None (white).
        config: stride and confidence settings.
        device: where the result lives.

    Returns:
        ``([M, 3] float32 points, [M, 3] float32 colours 0..255, pixels looked at)``.

    Raises:
        ValueError: shapes that do not fit together.
    """
    s = config.pixel_stride
    d = as_tensor(depth, device, torch.float32)
    if d.ndim != 2:
        raise ValueError(f'map: depth must be [H, W], got {list(d.shape)}')
    d = d[::s, ::s]
    pts = as_tensor(points, device, torch.float32)[::s, ::s]
    conf = None if confidence is None else as_tensor(confidence, device, torch.float32)[::s, ::s]
    colour = None if rgb is None else as_tensor(rgb, device, torch.float32)[::s, ::s]
    _check_shapes(d, pts, conf, colour)
    keep = torch.isfinite(d) & (d > 0)
    if conf is not None:
        keep &= _confidence_mask(conf, keep, config)
    # One index of the kept pixels: every later gather uses it (one host sync, not four).
    sel = torch.nonzero(keep.reshape(-1)).squeeze(1)
    kept = pts.reshape(-1, 3).index_select(0, sel)
    colours = colour.reshape(-1, 3).index_select(0, sel) if colour is not None \
        else torch.full_like(kept, 255.0)
    return kept, colours, d.numel()


FIXED_FIELDS = ('voxel_size', 'max_points')
"""``map.*`` fields a live map cannot change (its voxel keys and bound depend on them)."""


def check_live_config(old: MapConfig, new: MapConfig) -> None:
    """Raise ValueError if ``new`` changes a field a live map keeps (``FIXED_FIELDS``)."""
    for name in FIXED_FIELDS:
        if getattr(new, name) != getattr(old, name):
            raise ValueError(f'map.{name} cannot change on a live map '
                             f'({getattr(old, name)} -> {getattr(new, name)})')


class LiveSettings:
    """The ``map.*`` settings of a live point map: filters and stride change, the voxels do not."""

    _config: MapConfig

    @property
    def config(self) -> MapConfig:
        """Return the settings in effect."""
        return self._config

    @config.setter
    def config(self, config: MapConfig) -> None:
        """Change the filters and the stride (voxel size and bound are fixed).

        Raises:
            ValueError: ``voxel_size`` or ``max_points`` differs.
        """
        check_live_config(self._config, config)
        self._config = config


class Anchored(Protocol):
    """A keyframe's share of a map, placed by its keyframe's pose (None: not placed yet)."""

    keyframe_id: int
    pose: np.ndarray | None


def place_anchored(items: Iterable[Anchored], keyframe_ids: list[int] | np.ndarray,
                   poses: np.ndarray, what: str) -> int:
    """Give keyframe-anchored items their keyframes' current poses (after a correction).

    The caller holds its lock. Ids without an item are skipped; an unchanged pose is no change.

    Args:
        items: the map's items (pieces of the point map, scans of the grid).
        keyframe_ids: [K] keyframe ids.
        poses: [K, 4, 4] Sim(3) poses.
        what: the map's name, for errors (``map``, ``grid``).

    Returns:
        The number of items whose pose changed.

    Raises:
        ValueError: a malformed or non-finite pose, or counts that differ; nothing changes.
    """
    ids = [int(i) for i in np.asarray(keyframe_ids).reshape(-1)]
    poses = np.asarray(poses, np.float64)
    if poses.shape != (len(ids), 4, 4):
        raise ValueError(f'{what}: {len(ids)} keyframe ids but poses {list(poses.shape)}')
    poses = sim3.check_poses(poses, f'{what} poses') if ids else poses
    by_id = dict(zip(ids, poses))
    changed = 0
    for item in items:
        pose = by_id.get(item.keyframe_id)
        if pose is None or (item.pose is not None and np.array_equal(pose, item.pose)):
            continue
        item.pose = pose.copy()
        changed += 1
    return changed


def voxel_keys(points: torch.Tensor, voxel_size: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the voxel keys of the points that have one and those points' indices.

    Args:
        points: [M, 3] float points.
        voxel_size: voxel edge.

    Returns:
        ``([K] int64 keys, [K] int64 indices into points)``; ``M - K`` points are out of range
        (or not finite).
    """
    cell = torch.floor(points / voxel_size)
    inside = torch.isfinite(cell).all(dim=1) & ((cell >= -_OFFSET) & (cell < _OFFSET)).all(dim=1)
    index = torch.nonzero(inside).squeeze(1)
    cell = cell[index].to(torch.int64) + _OFFSET
    return (cell[:, 0] << (2 * KEY_BITS)) | (cell[:, 1] << KEY_BITS) | cell[:, 2], index


def _confidence_mask(conf: torch.Tensor, valid: torch.Tensor, cfg: MapConfig) -> torch.Tensor:
    """Pixels whose confidence passes the absolute floor and the keyframe's percentile."""
    keep = torch.isfinite(conf) & (conf >= cfg.min_confidence)
    if cfg.confidence_percentile > 0:
        # NaN outside the candidates instead of a masked copy: no host sync. With no candidate
        # the threshold is NaN and nothing passes, as nothing valid was left anyway.
        candidates = torch.where(valid & keep, conf, torch.nan).reshape(-1)
        keep &= conf >= torch.nanquantile(candidates, cfg.confidence_percentile / 100.0)
    return keep


def _check_shapes(depth: torch.Tensor, points: torch.Tensor, conf: torch.Tensor | None,
                  rgb: torch.Tensor | None) -> None:
    if tuple(points.shape) != (*depth.shape, 3):
        raise ValueError(f'map: points {list(points.shape)} are not depth '
                         f'{list(depth.shape)} x 3')
    if conf is not None and conf.shape != depth.shape:
        raise ValueError(f'map: confidence {list(conf.shape)} differs from depth '
                         f'{list(depth.shape)}')
    if rgb is not None and tuple(rgb.shape) != (*depth.shape, 3):
        raise ValueError(f'map: rgb {list(rgb.shape)} is not depth {list(depth.shape)} x 3')
