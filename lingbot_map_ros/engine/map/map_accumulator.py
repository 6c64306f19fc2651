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
"""MapAccumulator: keyframes' depth -> one voxel-downsampled, bounded, coloured point map.

Used by the node (``~/map``, ``~/save``) and by the offline replay (``--ply``): one
implementation, one :class:`~lingbot_map_ros.config.MapConfig`. Everything runs with torch on the
engine's device; nothing here knows about ROS.

Per keyframe (:meth:`MapAccumulator.add_points`, given the keyframe's depth already unprojected
into the map frame, ``FramePrediction.points``: the same points ``~/cloud`` publishes;
:meth:`MapAccumulator.add` unprojects them itself with ``geometry.unproject_depth``):

1. every ``pixel_stride``-th pixel of the depth map; pixels with a depth that is not finite and
   positive are dropped;
2. confidence filter: the ``confidence_percentile`` % least confident pixels of the keyframe and
   those under ``min_confidence`` are dropped;
3. the rest keep their points in the map frame;
4. points fall into voxels of edge ``voxel_size``; a voxel keeps one point, the weighted mean of
   the positions and colours that fell into it. The weight is capped at ``MAX_WEIGHT`` so a voxel
   keeps following new observations (drift) and float32 sums stay exact;
5. past ``max_points`` voxels, those seen longest ago go first (ties: the fewest observations).

The map is three tensors on the device, sorted by voxel key: keys [N], data [N, 7] (mean x y z,
mean r g b, weight) and the keyframe that last saw each voxel [N]. Voxel keys pack the three
integer voxel coordinates into one int64 (21 bits each), so a point
farther than ``2**20`` voxels from the origin on some axis is dropped and counted
(``num_out_of_range``). Dims: ``N`` map points, ``M`` new points of a keyframe.

All public methods are serialised by one lock: a worker thread adds while a timer reads.
"""

from __future__ import annotations

from dataclasses import dataclass
import threading

from lingbot_map_ros.config import MapConfig
from lingbot_map_ros.engine.image.geometry import unproject_depth
from lingbot_map_ros.engine.map.keyframe_points import as_tensor, keyframe_points, LiveSettings, \
    voxel_keys
from lingbot_map_ros.engine.map.sorted_voxels import group_sums, insert_sorted, locate
import numpy as np
import torch

MAX_WEIGHT = 64.0
"""Cap on a voxel's observation weight (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class MapUpdate:
    """What one :meth:`MapAccumulator.add` did."""

    num_pixels: int
    """Pixels looked at (after the stride)."""
    num_points: int
    """Points that passed the depth and confidence filters and went into voxels."""
    num_out_of_range: int
    """Points dropped because their voxel index does not fit the key (far outliers)."""
    num_dropped: int
    """Voxels dropped to stay within ``max_points``."""
    map_points: int
    """Voxels in the map afterwards."""


class MapAccumulator(LiveSettings):
    """A voxel map of coloured points on one torch device."""

    def __init__(self, config: MapConfig, device: str | torch.device = 'cpu') -> None:
        """Start an empty map.

        Args:
            config: voxel size, bound and filters.
            device: torch device of the map (the engine's, so depth need not leave it).
        """
        self._config = config
        self._device = torch.device(device)
        self._lock = threading.Lock()
        self.clear()

    @property
    def device(self) -> torch.device:
        """Device of the map tensors."""
        return self._device

    @property
    def num_points(self) -> int:
        """Voxels in the map."""
        return int(self._keys.numel())

    @property
    def voxel_ids(self) -> torch.Tensor:
        """Voxel keys ``[N]``, int64, sorted and unique (the map's own tensor: do not write)."""
        return self._keys

    @property
    def num_keyframes(self) -> int:
        """Keyframes added since the last :meth:`clear`."""
        return self._keyframes

    def clear(self) -> int:
        """Empty the map; returns the number of points removed."""
        with self._lock:
            removed = int(self._keys.numel()) if hasattr(self, '_keys') else 0
            self._keys = torch.zeros(0, dtype=torch.int64, device=self._device)
            # x y z r g b (means) and the weight.
            self._data = torch.zeros(0, 7, dtype=torch.float32, device=self._device)
            self._last_seen = torch.zeros(0, dtype=torch.int64, device=self._device)
            self._keyframes = 0
            return removed

    def add(self, depth: torch.Tensor | np.ndarray, confidence: torch.Tensor | np.ndarray | None,
            rgb: torch.Tensor | np.ndarray | None, intrinsics: torch.Tensor | np.ndarray,
            c2w: torch.Tensor | np.ndarray) -> MapUpdate:
        """Add one keyframe from its depth and camera (:meth:`add_points` after unprojecting).

        Args:
            depth: [H, W] z-depth (map units).
            confidence: [H, W] depth confidence, or None (no confidence filter).
            rgb: [H, W, 3] uint8 colours, or None (white).
            intrinsics: [3, 3] pinhole matrix of the depth image.
            c2w: [4, 4] (or [3, 4]) camera optical frame -> map frame.

        Returns:
            What the keyframe changed.

        Raises:
            ValueError: shapes that do not fit together, a non-finite camera.
        """
        k, pose = _host(intrinsics), _host(c2w)
        if tuple(k.shape) != (3, 3) or tuple(pose.shape) not in ((3, 4), (4, 4)):
            raise ValueError(f'map: intrinsics {list(k.shape)} / c2w {list(pose.shape)} must be '
                             '[3, 3] / [4, 4]')
        if not (np.isfinite(k).all() and np.isfinite(pose).all()):
            raise ValueError('map: intrinsics or c2w has non-finite values')
        d = self._tensor(depth, torch.float32)
        if d.ndim != 2:
            raise ValueError(f'map: depth must be [H, W], got {list(d.shape)}')
        return self.add_points(unproject_depth(d, k, pose, dtype=torch.float32), d, confidence,
                               rgb)

    def add_points(self, points: torch.Tensor | np.ndarray, depth: torch.Tensor | np.ndarray,
                   confidence: torch.Tensor | np.ndarray | None,
                   rgb: torch.Tensor | np.ndarray | None) -> MapUpdate:
        """Add one keyframe whose depth is already unprojected into the map frame.

        Args:
            points: [H, W, 3] points of every pixel in the map frame.
            depth: [H, W] z-depth of those pixels (which ones are valid).
            confidence: [H, W] depth confidence, or None (no confidence filter).
            rgb: [H, W, 3] uint8 colours, or None (white).

        Returns:
            What the keyframe changed.

        Raises:
            ValueError: shapes that do not fit together.
        """
        kept, colours, num_pixels = keyframe_points(points, depth, confidence, rgb,
                                                    self._config, self._device)
        with self._lock:
            return self._merge(kept, colours, num_pixels)

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Return the map as ``([N, 3] float32 xyz, [N, 3] uint8 rgb)`` numpy arrays."""
        with self._lock:
            data = self._data.cpu()
        rgb = data[:, 3:6].round().clamp(0, 255).to(torch.uint8)
        return data[:, :3].contiguous().numpy(), rgb.numpy()

    # ---- helpers ------------------------------------------------------------------------

    def _tensor(self, x: torch.Tensor | np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return as_tensor(x, self._device, dtype)

    def _merge(self, points: torch.Tensor, colours: torch.Tensor, num_pixels: int) -> MapUpdate:
        """Fold a keyframe's points into the map; the map's keys stay sorted, unique.

        Cost: O(M log M) for the keyframe's own voxels, O(N) copies only when voxels are added
        or dropped (no sort of the whole map).
        """
        keys, points, colours, out_of_range = self._voxel_keys(points, colours)
        ukeys, sums, _ = group_sums(keys, torch.cat([points, colours,
                                                     torch.ones_like(points[:, :1])], dim=1))
        pos, found = locate(self._keys, ukeys)
        # Voxels already in the map: weighted mean of the old point and the new ones.
        found_at = torch.nonzero(found).squeeze(1)
        new_at = torch.nonzero(~found).squeeze(1)
        idx, add = pos[found_at], sums[found_at]
        weight = self._data[idx, 6:7]
        total = weight + add[:, 6:7]
        self._data[idx, :6] = (self._data[idx, :6] * weight + add[:, :6]) / total
        self._data[idx, 6:7] = total.clamp(max=MAX_WEIGHT)
        self._last_seen[idx] = self._keyframes
        new = sums[new_at]
        self._insert(ukeys[new_at], pos[new_at],
                     torch.cat([new[:, :6] / new[:, 6:7], new[:, 6:7].clamp(max=MAX_WEIGHT)], 1))
        dropped = self._bound()
        self._keyframes += 1
        return MapUpdate(num_pixels=num_pixels, num_points=int(keys.numel()),
                         num_out_of_range=out_of_range, num_dropped=dropped,
                         map_points=int(self._keys.numel()))

    def _voxel_keys(self, points: torch.Tensor, colours: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        keys, inside = voxel_keys(points, self._config.voxel_size)
        out_of_range = points.shape[0] - inside.numel()
        if out_of_range:
            points, colours = points[inside], colours[inside]
        return keys, points, colours, out_of_range

    def _insert(self, keys: torch.Tensor, pos: torch.Tensor, data: torch.Tensor) -> None:
        """Merge sorted new ``keys`` (insertion points ``pos`` in the map) into the map."""
        if keys.numel() == 0:
            return
        self._keys, (self._data, self._last_seen) = insert_sorted(
            self._keys, keys, pos, [self._data, self._last_seen], [data, self._keyframes])

    def _bound(self) -> int:
        """Drop the voxels seen longest ago (ties: the lightest) past ``max_points``."""
        excess = self._keys.numel() - self._config.max_points
        if excess <= 0:
            return 0
        score = self._last_seen.to(torch.float64) * (MAX_WEIGHT + 1) \
            + self._data[:, 6].to(torch.float64)
        keep = torch.ones_like(self._keys, dtype=torch.bool)
        keep[torch.topk(score, excess, largest=False, sorted=False).indices] = False
        kept = torch.nonzero(keep).squeeze(1)  # ascending: the keys stay sorted
        self._keys, self._data, self._last_seen = \
            self._keys[kept], self._data[kept], self._last_seen[kept]
        return excess


def _host(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """Return a small matrix as float64 numpy (intrinsics and poses are read on the host)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)
