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
"""Deterministic "golden weights v1" for parity checks without the real checkpoints.

Every tensor value comes from integer arithmetic on the tensor's name, so the weights can be
rebuilt exactly anywhere (formula: ``shared/golden/README.md`` section 1). A splitmix64-style hash
of ``k + seed * golden_ratio`` gives a uniform ``u`` in [0, 1); the value is
``float32(offset + amp * (2u - 1))`` where ``(offset, amp)`` depends on what the tensor is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
import math
import re
import zlib

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_NORM_RE = re.compile(
    r'(^|\.)(norm|norm1|norm2|q_norm|k_norm|token_norm|trunk_norm)\.(weight|bias)$')
# Elements hashed per numpy call: bounds peak memory for the 12.6M-element camera-head weights.
_CHUNK = 1 << 22


def value_rule(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """Return ``(offset, amp)`` of a tensor; the first matching rule of the README wins."""
    if name == 'camera_head.pose_branch.fc2.bias':
        return 0.3, 0.02
    if name.endswith('gamma'):
        return 0.1, 0.05
    norm = _NORM_RE.search(name)
    if norm:
        return (1.0, 0.1) if norm.group(3) == 'weight' else (0.0, 0.05)
    if name.endswith('.bias'):
        return 0.0, 0.02
    if len(shape) >= 2 and name.endswith('.weight'):
        fan_in = math.prod(shape[1:])
        return 0.0, math.sqrt(3.0 / fan_in)
    return 0.0, 0.5


def golden_array(name: str, shape: Iterable[int], salt: int = 0) -> np.ndarray:
    """One tensor of the golden weights as a float32 numpy array of ``shape``."""
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    seed = (zlib.crc32(name.encode('utf-8')) ^ (salt & 0xFFFFFFFF)) & 0xFFFFFFFF
    base = np.uint64((seed * _GOLDEN) & _MASK64)
    offset, amp = value_rule(name, shape)
    out = np.empty(n, dtype=np.float32)
    for start in range(0, n, _CHUNK):
        z = np.arange(start, min(n, start + _CHUNK), dtype=np.uint64) + base
        z = (z ^ (z >> np.uint64(30))) * _MUL1
        z = (z ^ (z >> np.uint64(27))) * _MUL2
        z = z ^ (z >> np.uint64(31))
        u = (z >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)
        out[start:start + len(z)] = (offset + amp * (2.0 * u - 1.0)).astype(np.float32)
    return out.reshape(shape)


def golden_state_dict(shapes: Mapping[str, Iterable[int]],
                      salt: int = 0) -> dict[str, torch.Tensor]:
    """Golden weights for every ``name -> shape`` (e.g. a model's ``state_dict()`` shapes)."""
    return {name: torch.from_numpy(golden_array(name, shape, salt))
            for name, shape in shapes.items()}


def fill_golden_weights(model: torch.nn.Module, salt: int = 0) -> torch.nn.Module:
    """Write the golden weights into every state-dict tensor of ``model``, in place.

    One tensor at a time, so no second copy of the model is ever held (the official model is
    4.6 GB in float32). Works on any device and floating dtype (the float32 values, converted).

    Returns:
        ``model``.
    """
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(torch.from_numpy(golden_array(name, tuple(tensor.shape), salt)))
    return model
