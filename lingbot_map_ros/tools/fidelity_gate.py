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
"""The long-sequence fidelity gate: a run's errors against a set's reference, and the verdict.

A fidelity set (``shared/golden/long/README.md``) is ``<dir>/<name>.json`` + ``.safetensors``:
the official model's fp32 outputs over a long real sequence (``pose_enc`` [S, 9] float64,
``depth_s4`` [S, h, w] float32: every s-th row and column of the depth) and, in the JSON, the
official bf16 run's errors against them (``official_bf16_vs_fp32``: the yardstick) and the rule
(``gate``). Errors, over all S frames (``p``, ``r`` = the run's and the reference's pose_enc):

* ``t_mean``, ``t_max``: camera-centre error ``||p[:3] - r[:3]||``, no alignment;
* ``rot_deg_mean``, ``rot_deg_max``: ``2 acos(min(1, |<q_p, q_r>|))`` in degrees, the
  quaternions ``pose_enc[3:7]`` normalised;
* ``fov_max``: ``max |p[7:9] - r[7:9]|`` over both FoVs and all frames (radians);
* ``depth_rel_median``: median of ``|d - d_r| / max(|d_r|, 1e-6)`` over the stored pixels.

A run passes when every error the gate lists under ``means`` is at most
``means_at_most_x_official_bf16`` times the yardstick and every one under ``maxima`` at most
``maxima_at_most_x_official_bf16`` times it (a ratio within 1e-9 of its limit counts as at it:
the limits are printed to two decimals). A non-finite output gives an infinite error.

Everything about the set (frames, size, stride, N_s, W, K, salt, camera iterations, an optional
``model`` block for sets made with a non-official model) is read from its JSON; this module
needs numpy and safetensors only (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
import json
import math
from pathlib import Path
import re
from typing import Any

import numpy as np
from safetensors.numpy import load_file

ERROR_NAMES = ('t_mean', 't_max', 'rot_deg_mean', 'rot_deg_max', 'fov_max', 'depth_rel_median')
"""The six errors of a run, in the order they are printed."""

RATIO_SLACK = 1e-9
"""A ratio this close above its limit still passes: ``error / yardstick`` rounds."""

_DEPTH_FLOOR = 1e-6


@dataclass(frozen=True)
class FidelitySet:
    """One fidelity set: its JSON document and the stored reference outputs."""

    name: str
    """The set's name (``stream_D``)."""
    json_path: Path
    """Where its JSON lies (``inputs.folder`` is resolved from here)."""
    meta: dict[str, Any]
    """The JSON document."""
    pose_enc: np.ndarray
    """[S, 9] float64: the reference's pose encodings."""
    depth: np.ndarray
    """[S, h, w] float32: the reference depth at every ``depth_stride``-th row and column."""
    depth_stride: int
    """Row and column step of the stored depth."""

    @property
    def num_frames(self) -> int:
        """Return S, the number of frames of the sequence."""
        return int(self.pose_enc.shape[0])

    @property
    def size_hw(self) -> tuple[int, int]:
        """Return the processed frame size ``(H, W)`` the set was run at."""
        height, width = self.meta['inputs']['size_hw']
        return int(height), int(width)

    @property
    def yardstick(self) -> dict[str, float]:
        """Return the official bf16 run's errors (``official_bf16_vs_fp32``)."""
        return {k: float(v) for k, v in self.meta['official_bf16_vs_fp32'].items()}


def set_paths(path: str | Path) -> tuple[Path, Path]:
    """Return ``(json, safetensors)`` of a set given as ``DIR/name`` (suffix optional)."""
    path = Path(path)
    if path.suffix in ('.json', '.safetensors'):
        path = path.with_suffix('')
    return path.parent / f'{path.name}.json', path.parent / f'{path.name}.safetensors'


def load_set(path: str | Path) -> FidelitySet:
    """Load a fidelity set and check that its parts agree.

    Args:
        path: ``DIR/stream_X`` (with or without ``.json`` / ``.safetensors``).

    Raises:
        FileNotFoundError: the JSON or the tensors are missing.
        ValueError: a key is missing, or shapes disagree with the JSON (frames, size, stride).
    """
    json_path, tensors_path = set_paths(path)
    for part in (json_path, tensors_path):
        if not part.is_file():
            raise FileNotFoundError(f'fidelity set: {part} not found')
    meta = json.loads(json_path.read_text(encoding='utf-8'))
    missing = [k for k in ('inputs', 'stream', 'weights', 'official_bf16_vs_fp32', 'gate')
               if k not in meta]
    if missing:
        raise ValueError(f'{json_path}: no {missing} section(s); not a fidelity set')
    tensors = load_file(str(tensors_path))
    for key in ('pose_enc', 'depth_s4'):
        if key not in tensors:
            raise ValueError(f'{tensors_path}: no tensor {key!r} (has {sorted(tensors)})')
    pose, depth = tensors['pose_enc'].astype(np.float64), tensors['depth_s4']
    num_frames = len(meta['inputs']['frames'])
    if pose.shape != (num_frames, 9) or depth.ndim != 3 or depth.shape[0] != num_frames:
        raise ValueError(f'{tensors_path}: pose_enc {list(pose.shape)} and depth_s4 '
                         f'{list(depth.shape)} do not fit {num_frames} frames')
    stride = _depth_stride(meta, depth.shape[1:], json_path)
    return FidelitySet(meta.get('set', json_path.stem), json_path, meta, pose, depth, stride)


def _depth_stride(meta: dict[str, Any], stored_hw: tuple[int, ...], where: Path) -> int:
    """Read the stored depth's step (``depth_stride``, else ``::N`` in ``stored.depth_s4``)."""
    stride = meta.get('depth_stride')
    if stride is None:
        found = re.search(r'::(\d+)', str(meta.get('stored', {}).get('depth_s4', '')))
        if found is None:
            raise ValueError(f'{where}: neither depth_stride nor stored.depth_s4 says the '
                             "stored depth's step")
        stride = int(found.group(1))
    height, width = meta['inputs']['size_hw']
    expected = (math.ceil(height / stride), math.ceil(width / stride))
    if tuple(stored_hw) != expected:
        raise ValueError(f'{where}: depth_s4 is {list(stored_hw)}, but frames of '
                         f'{height}x{width} at step {stride} give {list(expected)}')
    return int(stride)


def pose_errors(pose_enc: np.ndarray, ref_pose_enc: np.ndarray) -> dict[str, np.ndarray]:
    """Per-frame camera-centre, rotation (degrees) and FoV errors of ``pose_enc`` [S, 9].

    Returns:
        ``{'t': [S], 'rot_deg': [S], 'fov': [S, 2]}``, float64.

    Raises:
        ValueError: the shapes differ or are not [S, 9].
    """
    pose = np.asarray(pose_enc, dtype=np.float64)
    ref = np.asarray(ref_pose_enc, dtype=np.float64)
    if pose.shape != ref.shape or pose.ndim != 2 or pose.shape[1] != 9:
        raise ValueError(f'pose_enc {list(pose.shape)} does not match the reference '
                         f'{list(ref.shape)} ([S, 9])')
    q_run = pose[:, 3:7] / np.linalg.norm(pose[:, 3:7], axis=1, keepdims=True)
    q_ref = ref[:, 3:7] / np.linalg.norm(ref[:, 3:7], axis=1, keepdims=True)
    cos_half = np.minimum(1.0, np.abs(np.sum(q_run * q_ref, axis=1)))
    return {'t': np.linalg.norm(pose[:, :3] - ref[:, :3], axis=1),
            'rot_deg': np.degrees(2.0 * np.arccos(cos_half)),
            'fov': np.abs(pose[:, 7:9] - ref[:, 7:9])}


def depth_relative_errors(depth: np.ndarray, ref_depth: np.ndarray) -> np.ndarray:
    """Elementwise ``|d - d_r| / max(|d_r|, 1e-6)`` of two equally shaped depth arrays.

    Raises:
        ValueError: the shapes differ.
    """
    run = np.asarray(depth, dtype=np.float64)
    ref = np.asarray(ref_depth, dtype=np.float64)
    if run.shape != ref.shape:
        raise ValueError(f'depth {list(run.shape)} does not match the reference '
                         f'{list(ref.shape)}')
    return np.abs(run - ref) / np.maximum(np.abs(ref), _DEPTH_FLOOR)


def fidelity_errors(pose_enc: np.ndarray, depth: np.ndarray,
                    reference: FidelitySet) -> dict[str, float]:
    """Return the six errors of a run against ``reference`` (module docstring).

    Args:
        pose_enc: [S, 9] the run's pose encodings.
        depth: [S, h, w] the run's depth, already subsampled as the set stores it.
        reference: the set.

    Returns:
        ``{name: error}`` for every name of :data:`ERROR_NAMES`; ``inf`` where the run's outputs
        are not finite (a NaN would compare as neither pass nor fail).
    """
    per_frame = pose_errors(pose_enc, reference.pose_enc)
    rel = depth_relative_errors(depth, reference.depth)
    errors = {'t_mean': per_frame['t'].mean(), 't_max': per_frame['t'].max(),
              'rot_deg_mean': per_frame['rot_deg'].mean(),
              'rot_deg_max': per_frame['rot_deg'].max(),
              'fov_max': per_frame['fov'].max(), 'depth_rel_median': np.median(rel)}
    return {k: float(v) if np.isfinite(v) else math.inf for k, v in errors.items()}


@dataclass(frozen=True)
class Verdict:
    """A run judged by a set's gate."""

    errors: dict[str, float]
    ratios: dict[str, float]
    """Each error over the official bf16 run's."""
    limits: dict[str, float]
    """The largest ratio each error may have."""
    failed: tuple[str, ...]
    """Errors over their limit, in :data:`ERROR_NAMES` order."""

    @property
    def passed(self) -> bool:
        """Return True when no error is over its limit."""
        return not self.failed

    @property
    def worst_ratio(self) -> float:
        """Return the largest ratio (the issue's 'worst error / official bf16 error')."""
        return max(self.ratios.values())


def gate_limits(meta: dict[str, Any]) -> dict[str, float]:
    """Return ``{error: largest ratio}`` from a set's ``gate`` block.

    Raises:
        ValueError: the gate names an error this module does not compute, or lists one twice.
    """
    gate = meta['gate']
    limits: dict[str, float] = {}
    for group, factor in (('means', 'means_at_most_x_official_bf16'),
                          ('maxima', 'maxima_at_most_x_official_bf16')):
        for name in gate[group]:
            if name not in ERROR_NAMES or name in limits:
                raise ValueError(f"gate.{group}: '{name}' is unknown or listed twice "
                                 f'(known: {ERROR_NAMES})')
            limits[name] = float(gate[factor])
    return limits


def judge(errors: dict[str, float], meta: dict[str, Any]) -> Verdict:
    """Judge ``errors`` by the set's gate against its official bf16 errors.

    Raises:
        ValueError: the gate or the yardstick lacks one of the errors.
    """
    limits = gate_limits(meta)
    yardstick = meta['official_bf16_vs_fp32']
    ratios: dict[str, float] = {}
    for name in limits:
        if name not in yardstick or name not in errors:
            raise ValueError(f"no '{name}' in the run's errors or in official_bf16_vs_fp32")
        ratios[name] = _ratio(errors[name], float(yardstick[name]))
    failed = tuple(n for n in ERROR_NAMES if n in limits
                   and not ratios[n] <= limits[n] + RATIO_SLACK)
    return Verdict(dict(errors), ratios, limits, failed)


def _ratio(error: float, official: float) -> float:
    if official > 0:
        return error / official
    return 0.0 if error == 0 else math.inf


def verdict_lines(verdict: Verdict) -> list[str]:
    """Return one printed line per error: value, ratio, limit and ok/FAIL."""
    lines = []
    for name in ERROR_NAMES:
        if name not in verdict.limits:
            continue
        mark = 'FAIL' if name in verdict.failed else 'ok'
        lines.append(f'  {name:17s} {verdict.errors[name]:<12.5g} x{verdict.ratios[name]:<7.3f} '
                     f'(<= {verdict.limits[name]:.2f}) {mark}')
    return lines
