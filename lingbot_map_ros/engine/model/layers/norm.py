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
"""LayerNorm that always normalises in at least float32.

Special: the output stays in the wider dtype (float32 for bf16/fp16/fp32 input, float64 for
float64 input). This reproduces the reference mixed-precision flow (spec §4.6), where LayerNorm
runs in float32 under bf16 autocast and the aggregator residual stream stays float32. Parameter
names (``weight``, ``bias``) are those of ``torch.nn.LayerNorm``, so checkpoints load unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """Return ``dtype`` widened to at least float32 (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed in ``wide_dtype(x.dtype)``; the output keeps that dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension.

        Args:
            x: [..., C] tensor of any float dtype.

        Returns:
            [..., C] tensor in float32, or float64 when ``x`` is float64.
        """
        dtype = wide_dtype(x.dtype)
        weight = None if self.weight is None else self.weight.to(dtype)
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.layer_norm(x.to(dtype), self.normalized_shape, weight, bias, self.eps)
