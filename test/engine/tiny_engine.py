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
"""The engine tests' one tiny engine and one source of random frames.

- ``tiny_config(*overrides)``: the 'tiny' preset on the CPU with the ``sdpa`` backend and
  112-pixel-wide network input, each test's flat settings laid over it;
- ``tiny_session(*overrides, **kwargs)``: a ``StreamingSession`` on random weights of that config;
- ``random_frames(count, seed, size)``: camera frames, H x W x 3 uint8, from one numpy seed;
- ``random_images(count, seed, hw)``: network-ready images, ``count`` x 3 x H x W in [0, 1).

A plain module, not ``conftest.py``: every conftest of the suite is imported under the one name
``conftest``, so a test could not import from it reliably when several directories are collected.
"""

from __future__ import annotations

from collections.abc import Mapping

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.session.pipeline import StreamingSession
import numpy as np
import torch

TINY = {'model.preset': 'tiny', 'stream.device': 'cpu', 'stream.image_width': 112,
        'cache.backend': 'sdpa'}
FRAME_SIZE = (64, 128)  # a camera frame that becomes 56 x 112 network input
IMAGE_HW = (56, 84)


def tiny_config(*overrides: Mapping[str, object]) -> EngineConfig:
    """Return the tiny CPU engine configuration with ``overrides`` (flat keys) applied in order."""
    values = dict(TINY)
    for layer in overrides:
        values.update(layer)
    return EngineConfig.from_flat(values)


def tiny_session(*overrides: Mapping[str, object], **kwargs) -> StreamingSession:
    """Return a session of ``tiny_config(*overrides)`` on random weights (``kwargs`` to it)."""
    return StreamingSession(tiny_config(*overrides), allow_random_weights=True, **kwargs)


def random_frames(count: int, seed: int = 0,
                  size: tuple[int, int] = FRAME_SIZE) -> list[np.ndarray]:
    """Return ``count`` uniform random RGB frames of ``size`` (H, W), drawn from one seed."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(count)]


def random_frame(seed: int = 0, size: tuple[int, int] = FRAME_SIZE) -> np.ndarray:
    """Return the first of ``random_frames(1, seed, size)``."""
    return random_frames(1, seed, size)[0]


def random_images(count: int, seed: int | torch.Generator = 0, hw: tuple[int, int] = IMAGE_HW,
                  device: str = 'cpu', dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Return ``count`` x 3 x H x W uniform values in [0, 1) on ``device``.

    ``seed`` is a seed or a generator to draw on from (several tensors of one sequence); a seed
    gives the values ``torch.manual_seed(seed)`` then ``torch.rand`` on ``device`` would.
    """
    gen = seed
    if not isinstance(gen, torch.Generator):
        gen = torch.Generator(device=device).manual_seed(seed)
    return torch.rand(count, 3, *hw, generator=gen, device=device, dtype=dtype)
