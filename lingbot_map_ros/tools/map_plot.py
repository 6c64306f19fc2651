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
"""Pictures of an accumulated map (PNG, matplotlib, no display): a top view and a perspective.

:func:`ground_truth_map` builds the map of the synthetic scene from its ground-truth depth and
poses with the node's accumulator (``engine/map/map_accumulator.py``) and ``map.*`` settings, so
the demo can show what the node builds when depth and poses are right (the demo's random-weight
model gives meaningless depth). :func:`plot_map` draws any map, e.g. a ``map.ply`` from
``~/save`` or ``lingbot_map_replay run --ply``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lingbot_map_ros.config import MapConfig
from lingbot_map_ros.engine.map.map_accumulator import MapAccumulator
from lingbot_map_ros.ros.messages.conversions import map_axes_transform
from lingbot_map_ros.tools.synthetic_scene import SyntheticSequence
import numpy as np

# Ground-plane axes (horizontal, vertical) and the up axis, per map axes.
_PLANE = {'flu': (1, 0, 2), 'optical': (0, 2, 1)}
_MAX_DRAWN = 150_000


def ground_truth_map(seq: SyntheticSequence, config: MapConfig,
                     map_axes: str = 'flu') -> MapAccumulator:
    """Accumulate every frame of a synthetic sequence from its true depth and poses.

    Args:
        seq: the rendered sequence (depth in metres, poses in the first camera's frame).
        config: the ``map.*`` settings (there is no confidence: the filter does nothing).
        map_axes: axes of the map frame, as the node's ``frames.map_axes``.

    Returns:
        The filled accumulator (on the CPU).
    """
    acc = MapAccumulator(replace(config, confidence_percentile=0.0), 'cpu')
    # The renderer samples pixel centres (u + 0.5); the engine's unprojection uses u.
    k = np.array(seq.intrinsics, np.float64)
    k[:2, 2] -= 0.5
    axes = map_axes_transform(map_axes)
    for depth, rgb, c2w in zip(seq.depth, seq.images, seq.c2w):
        acc.add(depth, None, rgb, k, axes @ c2w)
    return acc


def plot_map(path: str | Path, xyz: np.ndarray, rgb: np.ndarray,
             cameras: np.ndarray | None = None, title: str = '', map_axes: str = 'flu') -> None:
    """Save a PNG of a coloured map: top view (left) and perspective view (right).

    Args:
        path: output PNG.
        xyz: [N, 3] map points in the map frame.
        rgb: [N, 3] uint8 colours.
        cameras: [M, 3] camera positions to draw as a line, or None.
        title: figure title.
        map_axes: 'flu' (z up) or 'optical' (-y up), the axes of the map frame.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    h, v, up = _PLANE[map_axes]
    sign = 1.0 if map_axes == 'flu' else -1.0
    cut = ''
    if cameras is not None and len(cameras) and len(xyz):
        # Hide what is well above the cameras (a ceiling) so both views show the inside.
        height = sign * xyz[:, up]
        limit = float(np.max(sign * cameras[:, up])) + 0.25 * float(np.ptp(height))
        low = height <= limit
        cut = f', {int((~low).sum())} above the cameras hidden'
        xyz, rgb = xyz[low], rgb[low]
    if len(xyz) > _MAX_DRAWN:  # a fixed subsample: the picture, not the map, is thinned
        pick = np.random.default_rng(0).choice(len(xyz), _MAX_DRAWN, replace=False)
        xyz, rgb = xyz[pick], rgb[pick]
    colours = np.asarray(rgb, np.float32) / 255.0
    fig = Figure(figsize=(13, 5.6), layout='constrained')
    FigureCanvasAgg(fig)
    top = fig.add_subplot(1, 2, 1)
    order = np.argsort(sign * xyz[:, up])  # highest points drawn last, as seen from above
    top.scatter(xyz[order, h], xyz[order, v], c=colours[order], s=0.8, linewidths=0)
    if cameras is not None and len(cameras):
        top.plot(cameras[:, h], cameras[:, v], 'k-', lw=1.2, label='camera path')
        top.plot(cameras[0, h], cameras[0, v], 'go', label='start')
        top.legend(loc='upper right', fontsize=8)
    if map_axes == 'flu':
        top.invert_xaxis()  # y points left: keep the view as seen from above
    top.set(title=f'top view ({len(xyz)} points drawn{cut})', aspect='equal')
    persp = fig.add_subplot(1, 2, 2, projection='3d')
    persp.scatter(xyz[:, h], xyz[:, v], sign * xyz[:, up], c=colours, s=0.3, linewidths=0,
                  depthshade=False)
    if cameras is not None and len(cameras):
        persp.plot(cameras[:, h], cameras[:, v], sign * cameras[:, up], 'k-', lw=1.2)
    persp.view_init(elev=35, azim=-120)
    persp.set_box_aspect(np.ptp(np.stack([xyz[:, h], xyz[:, v], xyz[:, up]]), axis=1) + 1e-6,
                         zoom=1.5)
    persp.set_axis_off()
    persp.set_title('perspective view')
    fig.suptitle(title or f'{len(xyz)} map points')
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), dpi=110)
