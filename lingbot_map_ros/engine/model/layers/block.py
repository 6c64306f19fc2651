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
"""Pre-norm transformer block: ``x + ls1(attn(norm1(x)))`` then ``x + ls2(mlp(norm2(x)))``.

Dims: B batch, N tokens, C channels.

Special:
- Used by the DINOv2 trunk (LayerNorm eps 1e-6, no QK-norm), the aggregator frame and global
  blocks (eps 1e-5, QK-norm) and the camera-head trunk (eps 1e-5, no QK-norm). Parameter names are
  ``norm1, attn.{qkv, q_norm, k_norm, proj}, ls1, norm2, mlp.{fc1, fc2}, ls2`` (spec §1.4).
- The residual stream keeps the dtype it arrives in: a float32 stream plus bf16 branches stays
  float32 (the aggregator on the GPU path), a bf16 stream stays bf16 (DINO on that path).
- ``rope`` and ``attend`` let callers plug in positional rotation and cached attention.
  ``forward`` is :meth:`Block.qkv` (up to the rotated q, k, v), the attention, then
  :meth:`Block.finish`: runners that put something else between the two (a paged cache, a CUDA
  graph boundary) call the two steps, so the block is written once.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attend, dense_attention, Rope, SelfAttention
from .layer_scale import LayerScale
from .mlp import Mlp
from .norm import LayerNorm


class Block(nn.Module):
    """One attention + MLP transformer block with LayerScale on both branches."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qk_norm: bool = False,
                 norm_eps: float = 1e-5) -> None:
        """Build the block.

        Args:
            dim: channel count C.
            num_heads: attention heads (head dim C / heads).
            mlp_ratio: MLP hidden width / C.
            qk_norm: LayerNorm q and k per head before RoPE.
            norm_eps: epsilon of norm1, norm2 and the QK-norms.
        """
        super().__init__()
        self.norm1 = LayerNorm(dim, eps=norm_eps)
        self.attn = SelfAttention(dim, num_heads, qk_norm=qk_norm, norm_eps=norm_eps)
        self.ls1 = LayerScale(dim)
        self.norm2 = LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim)

    def forward(self, x: torch.Tensor, rope: Rope | None = None,
                attend: Attend | None = None) -> torch.Tensor:
        """Run both residual branches.

        Args:
            x: [B, N, C] residual stream.
            rope: rotation for q and k (see :class:`SelfAttention`), or None.
            attend: attention over q, k, v [B, heads, N, D], or None for dense attention.

        Returns:
            [B, N, C] in the promoted dtype of ``x`` and the branch outputs.
        """
        q, k, v = self.qkv(x, rope)
        return self.finish(x, (attend or dense_attention)(q, k, v))

    def qkv(self, x: torch.Tensor,
            rope: Rope | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the block up to its attention: q, k, v [B, heads, N, D] of ``norm1(x)``, rotated."""
        q, k, v = self.attn.project_qkv(self.norm1(x))
        if rope is not None:
            q, k = rope(q), rope(k)
        return q, k, v

    def finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Run the block after its attention: both residual branches, given the attended ``o``."""
        x = x + self.ls1(self.attn.project_out(o))
        return x + self.ls2(self.mlp(self.norm2(x)))
