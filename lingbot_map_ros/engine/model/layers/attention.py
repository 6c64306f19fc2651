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
"""Multi-head self-attention with optional QK-LayerNorm and pluggable RoPE / attention.

Dims: B batch (frames for frame-local attention, 1 for cross-frame attention), N tokens,
C = heads * D channels, D head dim.

Special:
- ``qkv`` rows are [q | k | v], each split into heads of D contiguous channels.
- ``q_norm`` / ``k_norm`` are one ``LayerNorm(D)`` each, shared by all heads, applied before RoPE
  (spec §4.1). They compute in float32, so q and k leave them in float32 even when the linears run
  in bf16; v keeps the linear's dtype.
- ``forward`` takes a ``rope`` callable (applied to q and k) and an ``attend`` callable (replaces
  the dense softmax attention). The camera head plugs in its per-iteration KV cache and the global
  blocks the paged KV cache that way; both default to plain bidirectional attention.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
import torch.nn.functional as F

from .norm import LayerNorm

# q, k, v [B, heads, N, D] -> attended values [B, heads, N, D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# x [B, heads, N, D] -> rotated x, same shape
Rope = Callable[[torch.Tensor], torch.Tensor]


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Bidirectional softmax attention (scale 1/sqrt(D), no mask) in the dtype of ``v``.

    q and k may arrive in float32 (after QK-norm and RoPE) while v is bf16 on the GPU path; all
    three are cast to v's dtype, the compute dtype, as bf16 autocast would do.

    Args:
        q: [B, heads, Nq, D] queries.
        k: [B, heads, Nk, D] keys.
        v: [B, heads, Nk, D] values.

    Returns:
        [B, heads, Nq, D] in v's dtype.
    """
    return F.scaled_dot_product_attention(q.to(v.dtype), k.to(v.dtype), v)


class SelfAttention(nn.Module):
    """``proj(attend(rope(q_norm(q)), rope(k_norm(k)), v))``; parameters qkv, proj, q/k_norm."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool = False, norm_eps: float = 1e-5,
                 bias: bool = True) -> None:
        """Build the projections.

        Args:
            dim: channel count C.
            num_heads: number of heads; must divide ``dim``.
            qk_norm: add ``q_norm`` / ``k_norm`` (LayerNorm over the head dim, shared by heads).
            norm_eps: epsilon of the QK LayerNorms.
            bias: give ``qkv`` and ``proj`` a bias.

        Raises:
            ValueError: ``num_heads`` does not divide ``dim``.
        """
        super().__init__()
        if num_heads < 1 or dim % num_heads:
            raise ValueError(f'SelfAttention: num_heads={num_heads} does not divide dim={dim}')
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.q_norm = LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else None
        self.k_norm = LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else None
        self.proj = nn.Linear(dim, dim, bias=bias)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project tokens to per-head q, k, v (QK-norm applied, no RoPE).

        Args:
            x: [B, N, C] normalised tokens, any float dtype (cast to the weight dtype).

        Returns:
            q, k, v, each [B, heads, N, D]. With QK-norm q and k are float32 (float64 for a
            float64 model); v is in the weight dtype.
        """
        b, n, c = x.shape
        qkv = self.qkv(x.to(self.qkv.weight.dtype))
        q, k, v = qkv.view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def project_out(self, o: torch.Tensor) -> torch.Tensor:
        """Merge heads and apply ``proj``.

        Args:
            o: [B, heads, N, D] attended values.

        Returns:
            [B, N, C] in the weight dtype.
        """
        b, h, n, d = o.shape
        o = o.transpose(1, 2).reshape(b, n, h * d)
        return self.proj(o.to(self.proj.weight.dtype))

    def forward(self, x: torch.Tensor, rope: Rope | None = None,
                attend: Attend | None = None) -> torch.Tensor:
        """Attend over the tokens of ``x`` (or whatever ``attend`` adds to them).

        Args:
            x: [B, N, C] normalised tokens.
            rope: applied to q and k after QK-norm; None for no positional rotation.
            attend: replaces :func:`dense_attention` (e.g. attention through a KV cache).

        Returns:
            [B, N, C] in the weight dtype.
        """
        q, k, v = self.project_qkv(x)
        if rope is not None:
            q, k = rope(q), rope(k)
        o = (attend or dense_attention)(q, k, v)
        return self.project_out(o)
