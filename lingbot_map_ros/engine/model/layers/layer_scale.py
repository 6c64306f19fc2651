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
"""Per-channel LayerScale of a residual branch (parameter ``gamma``)."""

from __future__ import annotations

import torch
from torch import nn


class LayerScale(nn.Module):
    """Multiply the last dimension by a learned vector ``gamma`` of shape [C]."""

    def __init__(self, dim: int, init_value: float = 0.01) -> None:
        """Build ``gamma`` filled with ``init_value`` (the checkpoint overwrites it).

        Args:
            dim: channel count C.
            init_value: initial value of every entry.
        """
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_value)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x * gamma`` (out of place; the usual type promotion applies).

        Args:
            x: [..., C] tensor.

        Returns:
            [..., C] tensor.
        """
        return x * self.gamma
