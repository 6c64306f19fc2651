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
"""Make a small fidelity set on the CPU, in the format of ``shared/golden/long/`` (tests, demos).

The real sets hold the official model's fp32 outputs; a set made here holds our own float64
run instead (golden weights, ``reference`` cache attention, the golden driver
``golden.drive_stream``), so it checks the tooling and the gate, not parity with the official
code. Its yardstick (``official_bf16_vs_fp32``) is a float32 run with an FP8 K/V cache, the
CPU's stand-in for a low-precision run. A set made with a non-official model records it in an
optional ``model`` block (``preset`` plus every :class:`ModelConfig` field), which
``fidelity_inputs.model_config_for_set`` reads.

Usage::

    python -m lingbot_map_ros.tools.fidelity_set OUT_DIR --frames 12 --size 56x84

writes ``OUT_DIR/frames/*.png`` (synthetic) and ``OUT_DIR/stream_T.{json,safetensors}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from lingbot_map_ros.config import ModelConfig
from lingbot_map_ros.tools.fidelity_gate import ERROR_NAMES, fidelity_errors, FidelitySet
from lingbot_map_ros.tools.fidelity_inputs import read_frames
from lingbot_map_ros.tools.golden import build_golden_model, drive_stream
import numpy as np
from PIL import Image
from safetensors.numpy import save_file
import torch

GATE = {'means_at_most_x_official_bf16': 1.0, 'maxima_at_most_x_official_bf16': 1.25,
        'means': ['t_mean', 'rot_deg_mean', 'depth_rel_median'],
        'maxima': ['t_max', 'rot_deg_max', 'fov_max']}
"""The gate of ``shared/golden/long/stream_D.json``, written into every set made here."""


def write_synthetic_frames(folder: Path, count: int, size_hw: tuple[int, int],
                           seed: int = 0) -> list[str]:
    """Write ``count`` smooth, slowly moving RGB PNGs of ``size_hw``; return their names."""
    folder.mkdir(parents=True, exist_ok=True)
    height, width = size_hw
    rng = np.random.default_rng(seed)
    low = rng.random((3, height // 7 + 8, width // 7 + 8))
    names = []
    for i in range(count):
        shifted = np.roll(low, (i, 2 * i), axis=(1, 2))[:, :height // 7 + 1, :width // 7 + 1]
        up = np.kron(shifted, np.ones((7, 7)))[:, :height, :width]
        noise = rng.random((3, height, width)) * 0.05
        image = np.clip((up * 0.95 + noise) * 255, 0, 255).astype(np.uint8)
        names.append(f'{i:06d}.png')
        Image.fromarray(image.transpose(1, 2, 0)).save(folder / names[-1])
    return names


def _run(model_config: ModelConfig, salt: int, images: torch.Tensor, stream: dict[str, int],
         dtype: torch.dtype, kv_dtype: str, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Run the golden driver; return ``pose_enc`` [S, 9] float64 and the strided depth."""
    model = build_golden_model(model_config, salt, dtype)
    with torch.no_grad():
        out = drive_stream(model, images, stream, 'reference', [0], True, kv_dtype)
    depth = out['depth'][:, ::stride, ::stride].to(torch.float32).numpy()
    return out['pose_enc'].to(torch.float64).numpy(), depth


def make_fidelity_set(out_dir: Path, frames_dir: Path, names: list[str], *,
                      name: str = 'stream_T', model: ModelConfig | None = None,
                      salt: int = 0, scale_frames: int = 2, sliding_window: int = 3,
                      keyframe_interval: int = 1, depth_stride: int = 4) -> Path:
    """Run the reference and the yardstick on the frames and write the set.

    Args:
        out_dir: where ``<name>.json`` and ``<name>.safetensors`` go.
        frames_dir: the PNGs (recorded in ``inputs.folder`` relative to ``out_dir``'s parent
            when it lies below it, else as an absolute path).
        names: the frame files, in order.
        name: the set's name.
        model: the model (default: the tiny preset with the depth head).
        salt: golden weights salt.
        scale_frames: N_s.
        sliding_window: W.
        keyframe_interval: K.
        depth_stride: step of the stored depth's rows and columns.

    Returns:
        The set's path without suffix (what ``--set`` takes).
    """
    model = model or ModelConfig.from_preset('tiny', enable_depth=True)
    images = read_frames(frames_dir, names)
    size_hw = tuple(images.shape[-2:])
    stream = {'num_scale_frames': scale_frames, 'sliding_window': sliding_window,
              'keyframe_interval': keyframe_interval}
    pose, depth = _run(model, salt, images, stream, torch.float64, 'bfloat16', depth_stride)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({'pose_enc': pose, 'depth_s4': depth}, str(out_dir / f'{name}.safetensors'))
    meta = _meta(name, frames_dir, out_dir, names, size_hw, model, salt, stream, depth_stride)
    fset = FidelitySet(name, out_dir / f'{name}.json', meta, pose, depth, depth_stride)
    low_pose, low_depth = _run(model, salt, images, stream, torch.float32, 'float8_e4m3fn',
                               depth_stride)
    errors = fidelity_errors(low_pose, low_depth, fset)
    meta['official_bf16_vs_fp32'] = {k: errors[k] for k in ERROR_NAMES}
    (out_dir / f'{name}.json').write_text(json.dumps(meta, indent=1) + '\n', encoding='utf-8')
    return out_dir / name


def _meta(name: str, frames_dir: Path, out_dir: Path, names: list[str],
          size_hw: tuple[int, ...], model: ModelConfig, salt: int, stream: dict[str, int],
          depth_stride: int) -> dict[str, Any]:
    """Return the set's JSON document (the yardstick is added once it is measured)."""
    try:
        folder = str(frames_dir.resolve().relative_to(out_dir.resolve().parent))
    except ValueError:
        folder = str(frames_dir.resolve())
    model_block = {k: list(v) if isinstance(v, tuple) else v
                   for k, v in dataclasses.asdict(model).items()}
    return {
        'set': name,
        'reference': 'lingbot_map_ros golden driver, float64, reference backend, CPU',
        'weights': {'version': 'golden v1', 'salt': salt},
        'model': model_block,
        'inputs': {'frames': names, 'folder': folder, 'size_hw': list(size_hw),
                   'preprocessing': 'RGB uint8 / 255, no resize, no crop'},
        'stream': {'scale_frames': stream['num_scale_frames'],
                   'sliding_window': stream['sliding_window'],
                   'keyframe_interval': stream['keyframe_interval'],
                   'camera_num_iterations': model.camera_num_iterations},
        'stored': {'pose_enc': 'float64 [S, 9]',
                   'depth_s4': f'float32 depth[:, ::{depth_stride}, ::{depth_stride}]'},
        'depth_stride': depth_stride,
        'official_bf16_vs_fp32': {},
        'yardstick': 'float32 with an FP8 (e4m3) K/V cache against the float64 reference',
        'gate': GATE,
    }


def main(argv: list[str] | None = None) -> int:
    """Write synthetic frames and a small fidelity set; returns the exit status."""
    parser = argparse.ArgumentParser(prog='fidelity_set', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('out_dir', type=Path, help='output folder')
    parser.add_argument('--frames', type=int, default=12, help='frames S')
    parser.add_argument('--size', default='56x84', help='frame size HxW (multiples of 14)')
    parser.add_argument('--scale-frames', type=int, default=2, help='N_s')
    parser.add_argument('--window', type=int, default=3, help='W')
    parser.add_argument('--keyframe-interval', type=int, default=1, help='K')
    parser.add_argument('--salt', type=int, default=0, help='golden weights salt')
    args = parser.parse_args(argv)
    height, width = (int(v) for v in args.size.lower().split('x'))
    names = write_synthetic_frames(args.out_dir / 'frames', args.frames, (height, width))
    path = make_fidelity_set(args.out_dir, args.out_dir / 'frames', names, salt=args.salt,
                             scale_frames=args.scale_frames, sliding_window=args.window,
                             keyframe_interval=args.keyframe_interval)
    print(path)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
