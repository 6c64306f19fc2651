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
"""Voxel maps as sorted unique int64 keys with rows beside them, on the map's device.

Both point maps (``map_accumulator.py``, ``anchored_map.py``) keep their voxels sorted by key
(``keyframe_points.voxel_keys``): a keyframe's points are summed per key (:func:`group_sums`),
looked up in the map by binary search (:func:`locate`) and the new keys merged in by
:func:`insert_sorted` without a sort of the whole map: O(M log M) for the M new points, O(N)
copies of the N map rows only when keys are added.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_sums(keys: torch.Tensor, rows: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sum float32 ``rows`` [M, C] per key of ``keys`` [M].

    Returns:
        ``([U] sorted unique keys, [U, C] sums, [M] each row's index into them)``.
    """
    ukeys, inverse = torch.unique(keys, return_inverse=True)
    sums = torch.zeros(ukeys.numel(), rows.shape[1], dtype=torch.float32, device=rows.device)
    sums.index_add_(0, inverse, rows)
    return ukeys, sums, inverse


def locate(map_keys: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return where sorted ``keys`` are, or would go, in sorted ``map_keys``, and which are there.

    Returns:
        ``([U] int64 insertion points, [U] bool: the key is in the map at that point)``.
    """
    num_old = map_keys.numel()
    pos = torch.searchsorted(map_keys, keys)
    found = (pos < num_old) & (map_keys[pos.clamp(max=max(num_old - 1, 0))] == keys) \
        if num_old else torch.zeros_like(keys, dtype=torch.bool)
    return pos, found


def insert_sorted(map_keys: torch.Tensor, keys: torch.Tensor, pos: torch.Tensor,
                  map_rows: Sequence[torch.Tensor], rows: Sequence[torch.Tensor | int]
                  ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Merge sorted ``keys``, none in the map, at their insertion points ``pos`` (:func:`locate`).

    Args:
        map_keys: [N] the map's sorted keys.
        keys: [K] the new keys, sorted.
        pos: [K] their insertion points in ``map_keys``.
        map_rows: arrays [N, ...] kept beside the map's keys.
        rows: for each, the new keys' rows [K, ...] (or one value for all of them).

    Returns:
        ``([N + K] keys, the arrays [N + K, ...] in the same order)``.
    """
    num_new, num_old = keys.numel(), map_keys.numel()
    device = map_keys.device
    # Destinations in the merged arrays: each old entry moves up by the number of new keys
    # before it; each new key lands at its insertion point plus the new keys before it.
    new_at = pos + torch.arange(num_new, device=device)
    old_at = torch.arange(num_old, device=device) + torch.searchsorted(keys, map_keys)
    merged_keys = torch.empty(num_old + num_new, dtype=torch.int64, device=device)
    merged_keys[old_at], merged_keys[new_at] = map_keys, keys
    merged = []
    for old, new in zip(map_rows, rows):
        out = torch.empty((num_old + num_new, *old.shape[1:]), dtype=old.dtype, device=device)
        out[old_at], out[new_at] = old, new
        merged.append(out)
    return merged_keys, merged
