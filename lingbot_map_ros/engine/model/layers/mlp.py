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
"""Two-layer perceptron with exact (erf) GELU, as in the DINOv2/aggregator/camera blocks.

Special: the input is cast to the weight dtype, so a float32 residual stream can feed bf16
weights (the GPU bf16 path, spec §4.6) and the output comes back in the weight dtype.
"""

from __future__ import annotations

import torch
from torch import nn


class Mlp(nn.Module):
    """``fc2(GELU(fc1(x)))``; parameter names ``fc1.*``, ``fc2.*``."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None,
                 bias: bool = True) -> None:
        """Build the two linears.

        Args:
            in_features: input width.
            hidden_features: width after ``fc1``.
            out_features: output width (default ``in_features``).
            bias: give both linears a bias.
        """
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = nn.GELU(approximate='none')
        self.fc2 = nn.Linear(hidden_features, out_features or in_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the MLP to the last dimension.

        Args:
            x: [..., in_features] tensor of any float dtype.

        Returns:
            [..., out_features] tensor in the weight dtype.
        """
        x = self.fc1(x.to(self.fc1.weight.dtype))
        return self.fc2(self.act(x))
