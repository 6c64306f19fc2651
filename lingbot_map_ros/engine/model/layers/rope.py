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
"""Rotary position embeddings of the aggregator: 2-D (frame blocks) and 3-D video (global).

Dims: S frames, P = 6 + h*w tokens per frame (6 special tokens, then the h x w patch grid
row-major), N = S*P tokens, D = 64 head dim.

Special:
- 2-D RoPE (frame blocks, spec §4.3): dims [0, D/2) rotate by the row position, [D/2, D) by the
  column position; inside each half element i pairs with i + D/4 ("rotate half"); frequency
  ``base^(-2i/(D/2))`` with base 100. Patch (y, x) sits at (y+1, x+1), the special tokens at
  (0, 0).
- 3-D video RoPE (global blocks, spec §4.4): interleaved pairs (2k, 2k+1); pairs of the first
  20 dims take the time angle, the next 22 the row angle, the last 22 the column angle; an axis of
  width d has frequencies ``base^(-2j/d)`` with base 10000. Special slot j of frame t sits at
  (t, j, j), patch (y, x) at (t, 6+y, 6+x). The time table has ``max_frames`` rows.
- Angles and cos/sin are computed in float64 once, then cast to the working dtype (float32, or
  float64 for a float64 model) and kept per (resolution, device, dtype); calls only slice them.
"""

from __future__ import annotations

import torch

# Cache key: (h, w, device, dtype); value: (cos, sin)
_TableKey = tuple[int, int, torch.device, torch.dtype]


def _grid_positions(h: int, w: int, special_rows: torch.Tensor,
                    patch_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column positions [P] (float64) of one frame's tokens."""
    ys = torch.arange(h, dtype=torch.float64).repeat_interleave(w) + patch_offset
    xs = torch.arange(w, dtype=torch.float64).repeat(h) + patch_offset
    rows = torch.cat([special_rows, ys])
    cols = torch.cat([special_rows, xs])
    return rows, cols


def axis_frequencies(width: int, base: float) -> torch.Tensor:
    """Return the width/2 frequencies ``base^(-2j/width)`` of one rotary axis (float64)."""
    return base ** (-torch.arange(0, width, 2, dtype=torch.float64) / width)


def rotate_half_2d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply the 2-D rotate-half RoPE.

    Args:
        x: [..., N, D] queries or keys.
        cos: [N, D] table from :meth:`FrameRope.tables` (same dtype as x).
        sin: [N, D] table.

    Returns:
        [..., N, D] rotated tensor.
    """
    quarter = x.shape[-1] // 4
    parts = x.unflatten(-1, (2, 2, quarter))
    rotated = torch.stack((-parts[..., 1, :], parts[..., 0, :]), dim=-2).flatten(-3)
    return x * cos + rotated * sin


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE on interleaved pairs (2k, 2k+1).

    Args:
        x: [..., N, D] queries or keys.
        cos: [N, D/2] table from :meth:`VideoRope.tables` (same dtype as x).
        sin: [N, D/2] table.

    Returns:
        [..., N, D] rotated tensor.
    """
    pairs = x.unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class FrameRope:
    """2-D RoPE tables for the frame blocks, cached per (grid, device, dtype)."""

    def __init__(self, head_dim: int, num_special: int = 6, base: float = 100.0) -> None:
        """Configure the embedding.

        Args:
            head_dim: D; must be a multiple of 4.
            num_special: special tokens ahead of the patches (all at position (0, 0)).
            base: frequency base.

        Raises:
            ValueError: ``head_dim`` is not a multiple of 4.
        """
        if head_dim % 4:
            raise ValueError(f'FrameRope: head_dim={head_dim} must be a multiple of 4')
        self.head_dim = head_dim
        self.num_special = num_special
        self.base = base
        self._tables: dict[_TableKey, tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, h: int, w: int, device: torch.device,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos/sin tables of one frame, built on first use.

        Args:
            h: patch rows.
            w: patch columns.
            device: where the tables live.
            dtype: dtype of the rotated q/k (float32 or float64).

        Returns:
            cos, sin: [P, D] each, P = num_special + h*w.
        """
        key = (h, w, torch.device(device), dtype)
        if key not in self._tables:
            zeros = torch.zeros(self.num_special, dtype=torch.float64)
            rows, cols = _grid_positions(h, w, zeros, 1)
            freqs = axis_frequencies(self.head_dim // 2, self.base)
            # [P, 2 axes, D/4] angles, each half duplicated for its rotate-half partner
            angles = torch.stack([rows[:, None] * freqs, cols[:, None] * freqs], dim=1)
            angles = torch.cat([angles, angles], dim=-1).flatten(1)
            self._tables[key] = (angles.cos().to(device, dtype), angles.sin().to(device, dtype))
        return self._tables[key]


class VideoRope:
    """3-D (time, row, column) RoPE tables for the global blocks."""

    def __init__(self, head_dim: int = 64, max_frames: int = 1024,
                 axis_dims: tuple[int, int, int] = (20, 22, 22), num_special: int = 6,
                 base: float = 10000.0) -> None:
        """Configure the embedding.

        Args:
            head_dim: D; must equal ``sum(axis_dims)``.
            max_frames: rows of the time table (time indices 0 .. max_frames-1).
            axis_dims: dims given to time, rows and columns; each even.
            num_special: special tokens per frame; slot j sits at (t, j, j).
            base: frequency base.

        Raises:
            ValueError: the axis split does not fit ``head_dim``.
        """
        if sum(axis_dims) != head_dim or any(d % 2 for d in axis_dims):
            raise ValueError(f'VideoRope: axis_dims={axis_dims} must be even and sum to '
                             f'head_dim={head_dim}')
        self.head_dim = head_dim
        self.max_frames = max_frames
        self.axis_dims = axis_dims
        self.num_special = num_special
        self.base = base
        self._time: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self._space: dict[_TableKey, tuple[torch.Tensor, torch.Tensor]] = {}

    def _time_tables(self, device: torch.device,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        key = (torch.device(device), dtype)
        if key not in self._time:
            t = torch.arange(self.max_frames, dtype=torch.float64)
            angles = t[:, None] * axis_frequencies(self.axis_dims[0], self.base)
            self._time[key] = (angles.cos().to(device, dtype), angles.sin().to(device, dtype))
        return self._time[key]

    def _space_tables(self, h: int, w: int, device: torch.device,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        key = (h, w, torch.device(device), dtype)
        if key not in self._space:
            special = torch.arange(self.num_special, dtype=torch.float64)
            rows, cols = _grid_positions(h, w, special, self.num_special)
            row_freqs = axis_frequencies(self.axis_dims[1], self.base)
            col_freqs = axis_frequencies(self.axis_dims[2], self.base)
            angles = torch.cat([rows[:, None] * row_freqs, cols[:, None] * col_freqs], -1)
            self._space[key] = (angles.cos().to(device, dtype), angles.sin().to(device, dtype))
        return self._space[key]

    def tables(self, time_start: int, num_frames: int, h: int, w: int, device: torch.device,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos/sin for ``num_frames`` consecutive frames starting at time ``time_start``.

        Args:
            time_start: time index of the first frame.
            num_frames: S, frames laid out one after the other (time_start + s for frame s).
            h: patch rows.
            w: patch columns.
            device: where the tables live.
            dtype: dtype of the rotated q/k (float32 or float64).

        Returns:
            cos, sin: [S*P, D/2] each.

        Raises:
            ValueError: a time index outside [0, max_frames).
        """
        if time_start < 0 or time_start + num_frames > self.max_frames:
            raise ValueError(f'VideoRope: time indices {time_start}..'
                             f'{time_start + num_frames - 1} outside [0, {self.max_frames})')
        time_cos, time_sin = self._time_tables(device, dtype)
        space_cos, space_sin = self._space_tables(h, w, device, dtype)
        p = space_cos.shape[0]
        out = []
        for time_table, space_table in ((time_cos, space_cos), (time_sin, space_sin)):
            t = time_table[time_start:time_start + num_frames, None, :].expand(-1, p, -1)
            s = space_table.expand(num_frames, -1, -1)
            out.append(torch.cat([t, s], dim=-1).flatten(0, 1))
        return out[0], out[1]
