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
"""``lingbot_map_bench map``: the cost of adding one keyframe to the accumulated map.

What it measures and why: with ``map.enable`` the node adds every keyframe's depth to the map
(``engine/map/map_accumulator.py``) on the worker thread, between two frames, so the time it takes
adds to every keyframe's latency (its target and figures: docs/map.md, 'Cost'). The depth,
colours and poses come from the synthetic room of ``tools/synthetic_scene.py`` (ground-truth
depth, a camera loop; confidence uniform in [1, 10]), so voxels are revisited as on a real
loop. The map is filled first (``--prefill``), so the timings are those of a map at its bound,
the worst case.

Two timings per keyframe, after ``--warmup`` untimed ones, with CUDA synchronised around each:

* ``inputs_on_device``: depth, confidence and colours already on the device (torch tensors);
* ``inputs_on_host``: numpy inputs, as ``FramePrediction`` carries them today (with the
  upload).

The ``map.*`` settings come from the parameter file (default ``config/lingbot_map.yaml``) and
``--set``. The last line printed is one JSON document.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
import json
import statistics
import sys
import time
from typing import Any

from lingbot_map_ros.config import load_yaml, MapConfig
from lingbot_map_ros.engine.map.map_accumulator import MapAccumulator
from lingbot_map_ros.tools.config_files import find_config, parse_set
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig
import numpy as np
import torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags of the ``map`` subcommand to ``parser``."""
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='torch device of the map (default: cuda when available)')
    parser.add_argument('--width', type=int, default=504, help='depth width in pixels')
    parser.add_argument('--height', type=int, default=378, help='depth height in pixels')
    parser.add_argument('--frames', type=int, default=30, help='keyframes rendered (one loop)')
    parser.add_argument('--iters', type=int, default=60, help='timed keyframes per input kind')
    parser.add_argument('--warmup', type=int, default=5, help='untimed keyframes first')
    parser.add_argument('--prefill', type=int, default=-1,
                        help='map points added before timing (-1: map.max_points)')
    parser.add_argument('--params-file', default=None,
                        help="parameter YAML with the map.* settings (default: the package's "
                             'lingbot_map.yaml)')
    parser.add_argument('--set', action='append', default=[], metavar='map.KEY=VALUE',
                        help='override a map.* setting, e.g. map.voxel_size=0.02')
    parser.add_argument('--threads', type=int, default=0,
                        help='CPU threads of torch (0: torch default)')


def _map_config(args: argparse.Namespace) -> MapConfig:
    values = load_yaml(args.params_file or find_config('lingbot_map.yaml'))
    values.update(parse_set(args.set))
    return MapConfig.from_flat(values)


def _prefill(acc: MapAccumulator, num_points: int) -> None:
    """Fill the map with distinct voxels far from the scene, seen before any keyframe."""
    side = int(np.ceil(np.sqrt(max(num_points, 1))))
    voxel = acc.config.voxel_size
    depth = np.full((side, side), 1.0, np.float32)
    k = np.array([[1.0 / voxel, 0.0, 0.0], [0.0, 1.0 / voxel, 0.0], [0.0, 0.0, 1.0]])
    c2w = np.eye(4)
    c2w[2, 3] = 1e4 * voxel  # a wall of side x side voxels, away from the room
    kept = acc.config
    acc.config = replace(kept, pixel_stride=1, confidence_percentile=0.0, min_confidence=1.0)
    acc.add(depth, None, None, k, c2w)
    acc.config = kept


def _time(acc: MapAccumulator, frames: list[tuple[Any, ...]], iters: int, warmup: int,
          device: torch.device) -> list[float]:
    times = []
    for i in range(warmup + iters):
        depth, conf, rgb, k, c2w = frames[i % len(frames)]
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        acc.add(depth, conf, rgb, k, c2w)
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return times


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Render the scene, fill the map, time keyframes; print a table and one JSON line."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = _map_config(args)
    seq = render_sequence(SceneConfig(width=args.width, height=args.height,
                                      num_frames=args.frames))
    rng = np.random.default_rng(0)
    host = [(seq.depth[i], rng.uniform(1.0, 10.0, seq.depth[i].shape).astype(np.float32),
             seq.images[i], seq.intrinsics, seq.c2w[i]) for i in range(args.frames)]
    on_device = [(torch.as_tensor(d, device=device), torch.as_tensor(c, device=device),
                  torch.as_tensor(r, device=device), k, p) for d, c, r, k, p in host]
    result: dict[str, Any] = {
        'device': str(device), 'size_wh': [args.width, args.height],
        'map': asdict(config), 'torch': torch.__version__,
        'gpu': torch.cuda.get_device_name(device) if device.type == 'cuda' else None}
    for kind, frames in (('inputs_on_device', on_device), ('inputs_on_host', host)):
        acc = MapAccumulator(config, device)
        _prefill(acc, config.max_points if args.prefill < 0 else args.prefill)
        times = _time(acc, frames, args.iters, args.warmup, device)
        result[kind] = {'ms_mean': round(statistics.fmean(times), 3),
                        'ms_median': round(statistics.median(times), 3),
                        'ms_p95': round(float(np.percentile(times, 95)), 3),
                        'ms_max': round(max(times), 3), 'map_points': acc.num_points}
    lines = [f'map accumulator on {device} ({result["gpu"] or "cpu"}), {args.width}x'
             f'{args.height}, stride {config.pixel_stride}, voxel {config.voxel_size}, '
             f'max_points {config.max_points}',
             f'{"inputs":<8} {"mean ms":>9} {"median":>9} {"p95":>9} {"max":>9} {"points":>9}']
    for kind in ('inputs_on_device', 'inputs_on_host'):
        r = result[kind]
        lines.append(f'{kind[10:]:<8} {r["ms_mean"]:>9.3f} {r["ms_median"]:>9.3f} '
                     f'{r["ms_p95"]:>9.3f} {r["ms_max"]:>9.3f} {r["map_points"]:>9}')
    sys.stdout.write('\n'.join(lines) + '\n' + json.dumps(result) + '\n')
    return result
