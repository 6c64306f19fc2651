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
"""What a fidelity set fixes for a run: the model, the parameters, the frames, the weights.

Used by ``fidelity.py`` (the sweep) and ``fidelity_set.py`` (a small set made on the CPU). The
set's JSON (``fidelity_gate.FidelitySet``) is the only source: golden weights salt, model (the
demo build with the depth head; or the set's optional ``model`` block), processed size, N_s, W,
K, camera iterations, frame names and folder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
import time
from typing import Any

from lingbot_map_ros.config import CacheConfig, ModelConfig, StreamConfig
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.golden_weights import golden_state_dict
from lingbot_map_ros.tools.fidelity_gate import FidelitySet
import numpy as np
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file
import torch


def model_config_for_set(meta: dict[str, Any]) -> ModelConfig:
    """Return the model a set was made with.

    Without a ``model`` block: the demo build (official sizes, depth head on) with the set's
    camera iterations. A ``model`` block (sets made on the CPU with a small model) gives
    ``preset`` and any :class:`ModelConfig` field.

    Raises:
        ValueError: an unknown model field or value.
    """
    block = dict(meta.get('model') or {})
    preset = block.pop('preset', 'official')
    iterations = meta['stream'].get('camera_num_iterations')
    if iterations is not None:
        block.setdefault('camera_num_iterations', int(iterations))
    block.setdefault('enable_depth', True)
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(block) - known)
    if unknown:
        raise ValueError(f'set model block: unknown fields {unknown}')
    block = {k: tuple(v) if isinstance(v, list) else v for k, v in block.items()}
    return ModelConfig.from_preset(preset, **block)


def set_overrides(fset: FidelitySet) -> dict[str, Any]:
    """Return the flat parameters the set fixes (model, stream settings, size, depth on)."""
    stream, meta = fset.meta['stream'], fset.meta
    model = dataclasses.asdict(model_config_for_set(meta))
    flat = {f'model.{k}': list(v) if isinstance(v, tuple) else v for k, v in model.items()}
    frames = fset.num_frames
    flat.update({
        'cache.scale_frames': int(stream['scale_frames']),
        'cache.sliding_window': int(stream['sliding_window']),
        'stream.keyframe_interval': int(stream['keyframe_interval']),
        'stream.image_width': fset.size_hw[1],
        'stream.enable_depth': True,
    })
    # One session holds the whole sequence (no rollover: the reference has none).
    flat['stream.session_keyframes'] = max(frames + 1, StreamConfig.session_keyframes)
    flat['cache.max_total_frames'] = max(frames + 1, CacheConfig.max_total_frames)
    return flat


def frames_folder(fset: FidelitySet, frames_dir: str | Path | None = None) -> Path:
    """Return the folder of the set's frames: ``frames_dir``, else ``inputs.folder`` found.

    ``inputs.folder`` is relative to a folder at or above the set's (``shared/data/loop`` for
    ``shared/golden/long/stream_D``).

    Raises:
        FileNotFoundError: no such folder.
    """
    if frames_dir is not None:
        folder = Path(frames_dir)
        if not folder.is_dir():
            raise FileNotFoundError(f'--frames-dir {folder} is not a folder')
        return folder
    relative = Path(fset.meta['inputs']['folder'])
    start = fset.json_path.resolve().parent
    for base in (start, *start.parents):
        if (base / relative).is_dir():
            return base / relative
    raise FileNotFoundError(f"the set's frames folder '{relative}' is not beside or above "
                            f'{start}; give it with --frames-dir')


def load_frames(fset: FidelitySet, folder: Path) -> torch.Tensor:
    """Read the set's PNGs from ``folder``: :func:`read_frames` with its names and size."""
    return read_frames(folder, fset.meta['inputs']['frames'], fset.size_hw)


def read_frames(folder: Path, names: list[str],
                size_hw: tuple[int, int] | None = None) -> torch.Tensor:
    """Read PNGs as ``[S, 3, H, W]`` float32 RGB ``uint8 / 255``, as they are (no resize).

    Raises:
        FileNotFoundError: a frame is missing.
        ValueError: frames of another size than ``size_hw`` (or than the first frame).
    """
    frames = []
    for name in names:
        path = Path(folder) / name
        if not path.is_file():
            raise FileNotFoundError(f'frame {path} not found')
        with Image.open(path) as image:
            array = np.asarray(image.convert('RGB'), dtype=np.uint8)
        size_hw = size_hw or array.shape[:2]
        if array.shape[:2] != tuple(size_hw):
            raise ValueError(f'{path}: {array.shape[1]}x{array.shape[0]}, expected '
                             f'{size_hw[1]}x{size_hw[0]} (frames are fed unresized)')
        frames.append(torch.from_numpy(array.copy()).permute(2, 0, 1))
    return torch.stack(frames).to(torch.float32) / 255.0


def golden_weights_file(config: ModelConfig, salt: int, path: Path) -> Path:
    """Write golden weights v1 (``salt``) of ``config``'s model to ``path``, unless it has them.

    The file's metadata names the salt and the model, so a file for another set is rewritten.
    """
    tag = {'golden': 'v1', 'salt': str(salt),
           'model': json.dumps(dataclasses.asdict(config), sort_keys=True)}
    if path.is_file():
        try:
            with safe_open(str(path), 'pt') as f:
                if f.metadata() == tag:
                    return path
        except Exception as exc:  # noqa: BLE001 - safetensors' own error types: write it again
            print(f'{path} is unreadable ({exc}); writing it again', flush=True)
    start = time.perf_counter()
    with torch.device('meta'):
        shapes = {k: tuple(v.shape) for k, v in LingbotMapModel(config).state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(golden_state_dict(shapes, salt), str(path), metadata=tag)
    print(f'golden weights v1 (salt {salt}, {len(shapes)} tensors) written to {path} in '
          f'{time.perf_counter() - start:.1f} s', flush=True)
    return path
