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
"""AnchoredMap: a point map made of keyframe-anchored pieces that move with their keyframes.

With loop closure the keyframes' poses change after the fact; a map whose points were fused in
one frame keeps the old poses and shows a revisited wall twice. Here every keyframe keeps a
*piece*: its points in its own camera frame, and the published cloud is each piece moved by its
keyframe's current map-from-keyframe Sim(3), fused into voxels. Nothing here knows about ROS.

Per keyframe (:meth:`AnchoredMap.add`):

1. the pixels :func:`~lingbot_map_ros.engine.map.keyframe_points.keyframe_points` keeps (the
   stride, depth and confidence filters of the odom map); non-finite points are dropped and
   counted;
2. the points are voxel-downsampled *in the keyframe's frame* (edge ``map.voxel_size``, the
   weighted mean of each voxel, its weight the number of points it took) and thinned evenly to
   at most :data:`MAX_PIECE_POINTS` (counted). A piece holds 19 bytes a point (x y z float32,
   r g b uint8, the weight float32): at most 311 KB.

The map: the pieces that have a pose, moved into the map frame and fused into voxels of edge
``map.voxel_size``; a voxel keeps one point, the weighted mean of the positions and colours of
the piece points in it (no weight cap: the poses are corrected, not followed). A new piece goes
into the current voxel map (sorted keys, a binary search); after :meth:`AnchoredMap.set_poses`
changes a pose, the next read rebuilds the map from every piece in one vectorised pass on the
map's device.

Bounds, the oldest pieces go first (counted in ``num_dropped_pieces``): at most
``map.max_points`` voxels (past it the map is cut to :data:`REFILL` of it, so that the
next keyframes do not rebuild again at once) and at most
:data:`PIECE_BUDGET` × ``map.max_points`` stored piece points (19 bytes each: 38 MB at the
default 500,000). Dims: ``N`` map voxels, ``M`` points, ``P`` pieces.

One lock guards the pieces and the map: a worker thread adds while a timer reads. A rebuild
runs outside it, on a snapshot of the pieces and their poses (one rebuild at a time), so an add
never waits for one; a piece added meanwhile is folded in when the rebuilt map is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
import threading

from lingbot_map_ros.config import MapConfig
from lingbot_map_ros.engine import sim3
from lingbot_map_ros.engine.map.keyframe_points import as_tensor, keyframe_points, LiveSettings, \
    place_anchored, voxel_keys
from lingbot_map_ros.engine.map.sorted_voxels import group_sums, insert_sorted, locate
import numpy as np
import torch

MAX_PIECE_POINTS = 16384
"""Most points one keyframe's piece keeps (after its own voxel downsampling)."""
PIECE_BUDGET = 4
"""Stored piece points are bounded by this many times ``map.max_points``."""
REFILL = 0.9
"""Share of ``map.max_points`` a map is cut to when it overflows."""
_CHUNK = 1 << 20
"""Points moved at once in a rebuild (bounds the per-point pose copies)."""


@dataclass(frozen=True, slots=True)
class PieceUpdate:
    """What one :meth:`AnchoredMap.add` did."""

    num_pixels: int
    """Pixels looked at (after the stride)."""
    num_points: int
    """Points the piece keeps (after its voxel downsampling and thinning)."""
    num_thinned: int
    """Piece voxels thinned away to stay within :data:`MAX_PIECE_POINTS`."""
    num_non_finite: int
    """Kept pixels whose point was not finite (dropped)."""
    num_too_far: int
    """Points farther than the voxel keys reach from the keyframe (dropped)."""


@dataclass(slots=True, eq=False)  # pieces are compared by identity
class _Piece:
    keyframe_id: int
    xyz: torch.Tensor
    """[P, 3] float32 in the keyframe's frame."""
    rgb: torch.Tensor
    """[P, 3] uint8."""
    weight: torch.Tensor
    """[P] float32: the points each piece point stands for."""
    pose: np.ndarray | None
    """[4, 4] float64 map-from-keyframe, None while the keyframe has no place in the map."""


class AnchoredMap(LiveSettings):
    """Keyframe pieces and the voxel map they make under their current poses."""

    def __init__(self, config: MapConfig, device: str | torch.device = 'cpu') -> None:
        """Start an empty map.

        Args:
            config: voxel size, bound and filters (``map.*``).
            device: torch device of the pieces and the map.
        """
        self._config = config
        self._device = torch.device(device)
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        """Held by the one reader that rebuilds (outside ``_lock``: adds do not wait)."""
        self._generation = 0
        self.clear()

    @property
    def num_pieces(self) -> int:
        """Pieces kept (placed or not)."""
        with self._lock:
            return len(self._pieces)

    @property
    def num_points(self) -> int:
        """Voxels in the map (rebuilt first when poses changed)."""
        self._ensure_built()
        with self._lock:
            return int(self._keys.numel())

    def clear(self) -> int:
        """Drop every piece and the map; returns the number of map voxels removed."""
        with self._lock:
            removed = int(self._keys.numel()) if hasattr(self, '_keys') else 0
            self._pieces: list[_Piece] = []
            self._stored = 0
            self._counts = dict.fromkeys(('num_dropped_pieces', 'num_thinned', 'num_non_finite',
                                          'num_too_far', 'num_rebuilds'), 0)
            self._out_of_range = 0
            self._reset_voxels()
            self._dirty = self._building = False
            self._generation += 1
            return removed

    def stats(self) -> dict[str, int]:
        """Return the counters and sizes (the map as of the last build)."""
        with self._lock:
            return {**self._counts, 'num_pieces': len(self._pieces),
                    'num_piece_points': self._stored, 'num_out_of_range': self._out_of_range,
                    'map_points': int(self._keys.numel()), 'dirty': int(self._dirty)}

    def add(self, keyframe_id: int, points: torch.Tensor | np.ndarray,
            depth: torch.Tensor | np.ndarray, confidence: torch.Tensor | np.ndarray | None,
            rgb: torch.Tensor | np.ndarray | None, pose: np.ndarray | None) -> PieceUpdate:
        """Add one keyframe's piece.

        Args:
            keyframe_id: the keyframe's id, larger than every earlier piece's (age order).
            points: [H, W, 3] points of every pixel in the keyframe's own frame.
            depth: [H, W] z-depth of those pixels (which ones are valid).
            confidence: [H, W] depth confidence, or None (no confidence filter).
            rgb: [H, W, 3] uint8 colours, or None (white).
            pose: [4, 4] map-from-keyframe Sim(3) now, or None (not placed yet:
                :meth:`set_poses` places it).

        Returns:
            What the piece kept.

        Raises:
            ValueError: an id not above the last one, a malformed or non-finite pose, shapes
                that do not fit together; nothing is added.
        """
        if pose is not None:
            pose = sim3.check_poses(np.asarray(pose, np.float64)[None], 'map pose')[0]
        kept, colours, num_pixels = keyframe_points(points, depth, confidence, rgb,
                                                    self._config, self._device)
        finite = torch.isfinite(kept).all(dim=1)
        good = torch.nonzero(finite).squeeze(1)
        non_finite = kept.shape[0] - good.numel()
        piece, thinned, too_far = self._downsample(keyframe_id, kept[good], colours[good], pose)
        with self._lock:
            if self._pieces and keyframe_id <= self._pieces[-1].keyframe_id:
                raise ValueError(f'map: keyframe id {keyframe_id} is not above the last one '
                                 f'({self._pieces[-1].keyframe_id})')
            self._pieces.append(piece)
            self._stored += piece.weight.numel()
            self._counts['num_thinned'] += thinned
            self._counts['num_non_finite'] += non_finite
            self._counts['num_too_far'] += too_far
            if pose is not None and not (self._dirty or self._building):
                self._merge(*self._moved([(piece, pose)]))
            if self._stored > PIECE_BUDGET * self._config.max_points or \
                    self._keys.numel() > self._config.max_points:
                self._dirty = True  # the next read drops the oldest pieces
        return PieceUpdate(num_pixels, int(piece.weight.numel()), thinned, non_finite, too_far)

    def set_poses(self, keyframe_ids: list[int] | np.ndarray, poses: np.ndarray) -> int:
        """Give keyframes their current map-from-keyframe poses (after a correction).

        Ids without a piece (dropped, or never added) are skipped. The map is rebuilt at the
        next read when a pose changed.

        Args:
            keyframe_ids: [K] keyframe ids.
            poses: [K, 4, 4] Sim(3) poses.

        Returns:
            The number of pieces whose pose changed.

        Raises:
            ValueError: a malformed or non-finite pose, or counts that differ; nothing changes.
        """
        with self._lock:
            changed = place_anchored(self._pieces, keyframe_ids, poses, 'map')
            self._dirty |= changed > 0
        return changed

    def poses(self) -> dict[int, np.ndarray | None]:
        """Return every piece's current pose by keyframe id (None: not placed)."""
        with self._lock:
            return {p.keyframe_id: None if p.pose is None else p.pose.copy()
                    for p in self._pieces}

    def piece_points(self, keyframe_id: int) -> np.ndarray:
        """Return one piece's points in the map frame as [P, 3] float32 (for checks and tools).

        Raises:
            KeyError: no piece with that id, or it is not placed.
        """
        with self._lock:
            piece = next((p for p in self._pieces if p.keyframe_id == keyframe_id), None)
            if piece is None or piece.pose is None:
                raise KeyError(f'map: no placed piece of keyframe {keyframe_id}')
            world, _, _ = self._moved([(piece, piece.pose)])
        return world.cpu().numpy()

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Return the map as ``([N, 3] float32 xyz, [N, 3] uint8 rgb)`` numpy arrays."""
        self._ensure_built()
        with self._lock:  # a copy: adds fold into the map's sums in place
            sums = self._sums.to('cpu', copy=True)
        mean = sums[:, :6] / sums[:, 6:7]
        rgb = mean[:, 3:6].round().clamp(0, 255).to(torch.uint8)
        return mean[:, :3].contiguous().numpy(), rgb.numpy()

    def rebuild(self) -> None:
        """Build the map from every piece now (else the next read does when needed)."""
        with self._lock:
            self._dirty = True
        self._ensure_built()

    # ---- helpers (under the lock unless said) --------------------------------------------

    def _downsample(self, keyframe_id: int, xyz: torch.Tensor, colours: torch.Tensor,
                    pose: np.ndarray | None) -> tuple[_Piece, int, int]:
        """One keyframe's points -> (its piece, points thinned away, points too far)."""
        keys, inside = voxel_keys(xyz, self._config.voxel_size)
        _, sums, _ = group_sums(keys, torch.cat([xyz[inside], colours[inside],
                                                 torch.ones_like(xyz[inside, :1])], dim=1))
        limit = min(MAX_PIECE_POINTS, self._config.max_points)
        thinned = max(sums.shape[0] - limit, 0)
        if thinned:  # evenly over the key order: every part of the view keeps some points
            sums = sums[torch.linspace(0, sums.shape[0] - 1, limit,
                                       device=self._device).round().long()]
        mean = sums[:, :6] / sums[:, 6:7]
        return _Piece(keyframe_id, mean[:, :3].contiguous(),
                      mean[:, 3:6].round().clamp(0, 255).to(torch.uint8), sums[:, 6].clone(),
                      pose), thinned, xyz.shape[0] - inside.numel()

    def _reset_voxels(self) -> None:
        self._keys = torch.zeros(0, dtype=torch.int64, device=self._device)
        # Sums of weight * (x y z r g b) and the weight: a mean is one division away.
        self._sums = torch.zeros(0, 7, dtype=torch.float32, device=self._device)

    def _moved(self, pieces: list[tuple[_Piece, np.ndarray]]
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pieces moved by the poses given: ([M, 3] points, [M, 4] weighted rgb + weight, [M]).

        Reads only the pieces' points, which never change: safe outside the lock.
        """
        if not pieces:
            empty = torch.zeros(0, 3, device=self._device)
            return empty, torch.zeros(0, 4, device=self._device), \
                torch.zeros(0, dtype=torch.int64, device=self._device)
        sizes = torch.tensor([p.weight.numel() for p, _ in pieces], device=self._device)
        owner = torch.repeat_interleave(torch.arange(len(pieces), device=self._device), sizes)
        pose = as_tensor(np.stack([m[:3] for _, m in pieces]), self._device, torch.float32)
        xyz = torch.cat([p.xyz for p, _ in pieces])
        world = torch.empty_like(xyz)
        for start in range(0, xyz.shape[0], _CHUNK):
            part = slice(start, start + _CHUNK)
            a = pose[owner[part]]
            world[part] = torch.einsum('mij,mj->mi', a[:, :, :3], xyz[part]) + a[:, :, 3]
        weight = torch.cat([p.weight for p, _ in pieces])[:, None]
        rgb = torch.cat([p.rgb for p, _ in pieces]).to(torch.float32) * weight
        return world, torch.cat([rgb, weight], dim=1), owner

    def _fuse(self, world: torch.Tensor, colour: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Points -> (sorted unique keys, their sums, inverse, the points' indices kept)."""
        keys, inside = voxel_keys(world, self._config.voxel_size)
        weight = colour[inside, 3:4]
        ukeys, sums, inverse = group_sums(keys, torch.cat([world[inside] * weight,
                                                           colour[inside]], dim=1))
        return ukeys, sums, inverse, inside

    def _merge(self, world: torch.Tensor, colour: torch.Tensor, owner: torch.Tensor) -> None:
        """Fold one piece's moved points into the voxel map (keys stay sorted and unique)."""
        ukeys, sums, _, inside = self._fuse(world, colour)
        self._out_of_range += world.shape[0] - inside.numel()
        pos, found = locate(self._keys, ukeys)
        self._sums.index_add_(0, pos[found], sums[found])
        new = torch.nonzero(~found).squeeze(1)
        if not new.numel():
            return
        self._keys, (self._sums,) = insert_sorted(self._keys, ukeys[new], pos[new],
                                                  [self._sums], [sums[new]])

    def _ensure_built(self) -> None:
        """Rebuild from the pieces when poses changed or a bound was passed (readers).

        The heavy part runs on a snapshot of the placed pieces and their poses outside the map
        lock, so an add on the frame thread never waits for a rebuild; pieces added meanwhile
        are folded in afterwards, and poses changed meanwhile leave the map dirty.
        """
        with self._build_lock:
            with self._lock:
                if not self._dirty:
                    return
                self._dirty, self._building = False, True
                self._counts['num_rebuilds'] += 1
                self._drop_oldest(self._within_budget())
                placed = [(p, p.pose) for p in self._pieces if p.pose is not None]
                generation = self._generation
            try:
                keys, sums, out_of_range, cut = self._build(placed)
            except BaseException:
                with self._lock:
                    self._dirty, self._building = True, False
                raise
            with self._lock:
                if generation != self._generation:
                    return  # cleared meanwhile: the build is of a map that is gone
                self._building = False
                self._keys, self._sums, self._out_of_range = keys, sums, out_of_range
                if cut and placed[cut][0] in self._pieces:
                    self._drop_oldest(self._pieces.index(placed[cut][0]))
                built = {id(p) for p, _ in placed[cut:]}
                late = [(p, p.pose) for p in self._pieces
                        if p.pose is not None and id(p) not in built]
                if late and not self._dirty:
                    self._merge(*self._moved(late))
                if self._keys.numel() > self._config.max_points:
                    self._dirty = True

    def _build(self, placed: list[tuple[_Piece, np.ndarray]]
               ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Fuse placed pieces: (keys, sums, points out of range, oldest placed pieces to drop)."""
        world, colour, owner = self._moved(placed)
        ukeys, sums, inverse, inside = self._fuse(world, colour)
        cut = 0
        if ukeys.numel() > self._config.max_points:
            # A voxel stays while any of its pieces stays: cut at the oldest piece that
            # leaves at most REFILL * max_points voxels behind.
            newest = torch.full((ukeys.numel(),), -1, dtype=torch.int64, device=self._device)
            newest.scatter_reduce_(0, inverse, owner[inside], reduce='amax')
            per_piece = torch.bincount(newest, minlength=len(placed))
            left = per_piece.flip(0).cumsum(0).flip(0)  # voxels kept when cutting before p
            target = max(int(REFILL * self._config.max_points), 1)
            cut = min(int((left > target).sum()), len(placed) - 1)
            world, colour, _ = self._moved(placed[cut:])
            ukeys, sums, _, inside = self._fuse(world, colour)
        return ukeys, sums, world.shape[0] - inside.numel(), cut

    def _within_budget(self) -> int:
        """Return how many of the oldest pieces to drop so the stored points fit the budget."""
        excess = self._stored - PIECE_BUDGET * self._config.max_points
        count = 0
        while excess > 0 and count < len(self._pieces) - 1:
            excess -= self._pieces[count].weight.numel()
            count += 1
        return count

    def _drop_oldest(self, count: int) -> None:
        if count <= 0:
            return
        for piece in self._pieces[:count]:
            self._stored -= piece.weight.numel()
        del self._pieces[:count]
        self._counts['num_dropped_pieces'] += count
