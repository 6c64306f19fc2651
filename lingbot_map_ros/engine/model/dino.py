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
"""DINOv2 ViT-L/14 trunk with 4 registers: the per-frame patch encoder of the aggregator.

Dims: S frames, H x W image (multiples of the patch size), h = H/14, w = W/14 patch grid,
C embed dim, R = 4 DINO registers.

Special:
- Token order inside the trunk is [cls, register x R, patches row-major]. The position embedding
  is added to [cls, patches] *before* the registers are inserted, so registers get no position.
- The learned position table covers a 37 x 37 grid (img_size 518). For any other grid it is
  resampled with antialiased bicubic interpolation to (h, w) in float32 (spec §2.3) and cast to the
  token dtype. The result is computed once per (grid, device, dtype) and reused; the key includes
  the parameter's version counter, so loading new weights invalidates it.
- LayerNorm eps 1e-6 everywhere; no QK-norm, no RoPE. The output is the final-normed patch tokens
  only (cls and registers dropped), in float32 (float64 for a float64 model).
- ``mask_token`` exists only so that checkpoints load; inference never uses it.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from .layers import Block, LayerNorm

_DINO_EPS = 1e-6


class PatchEmbed(nn.Module):
    """Non-overlapping patch projection (parameter names ``proj.weight``, ``proj.bias``)."""

    def __init__(self, patch_size: int, embed_dim: int) -> None:
        """Build the stride-``patch_size`` convolution from RGB to ``embed_dim`` channels.

        Args:
            patch_size: kernel size and stride in pixels.
            embed_dim: output channels C.
        """
        super().__init__()
        self.proj = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Embed the patches.

        Args:
            images: [S, 3, H, W] normalised images.

        Returns:
            [S, h*w, C] patch embeddings in the weight dtype, row-major.
        """
        x = self.proj(images.to(self.proj.weight.dtype))
        return x.flatten(2).transpose(1, 2)


class DinoTrunk(nn.Module):
    """ViT with registers; ``forward`` maps normalised images to final-normed patch tokens."""

    def __init__(self, img_size: int = 518, patch_size: int = 14, embed_dim: int = 1024,
                 depth: int = 24, num_heads: int = 16, mlp_ratio: float = 4.0,
                 num_registers: int = 4) -> None:
        """Build the trunk with checkpoint-compatible parameter names.

        Args:
            img_size: image size the position table was trained for (grid img_size/patch_size).
            patch_size: patch size in pixels.
            embed_dim: width C.
            depth: number of blocks.
            num_heads: attention heads.
            mlp_ratio: MLP hidden width / C.
            num_registers: register tokens R.
        """
        super().__init__()
        self.patch_size = patch_size
        self.grid_size = img_size // patch_size
        self.num_registers = num_registers
        self.patch_embed = PatchEmbed(patch_size, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.grid_size ** 2, embed_dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, num_registers, embed_dim))
        self.mask_token = nn.Parameter(torch.zeros(1, embed_dim))
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, mlp_ratio, qk_norm=False, norm_eps=_DINO_EPS)
            for _ in range(depth))
        self.norm = LayerNorm(embed_dim, eps=_DINO_EPS)
        self._pos_cache: dict[tuple, torch.Tensor] = {}

    def position_embedding(self, h: int, w: int, dtype: torch.dtype) -> torch.Tensor:
        """Return the [1, 1 + h*w, C] position table of an h x w grid (cls first).

        Args:
            h: patch rows.
            w: patch columns.
            dtype: token dtype the table is cast to.

        Returns:
            The table on the parameter's device, cached until the weights change.
        """
        pos = self.pos_embed
        key = (h, w, dtype, pos.device, pos.data_ptr(), pos._version)
        table = self._pos_cache.get(key)
        if table is None:
            self._pos_cache.clear()
            table = self._resample_positions(h, w).to(dtype)
            self._pos_cache[key] = table
        return table

    def _resample_positions(self, h: int, w: int) -> torch.Tensor:
        with torch.no_grad():
            pos = self.pos_embed.detach().float()
            if h == w == self.grid_size:
                return pos
            grid = self.grid_size
            patch = pos[:, 1:].reshape(1, grid, grid, -1).permute(0, 3, 1, 2)
            patch = F.interpolate(patch, size=(h, w), mode='bicubic', antialias=True)
            patch = patch.permute(0, 2, 3, 1).reshape(1, h * w, -1)
            return torch.cat([pos[:, :1], patch], dim=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Encode frames independently.

        Args:
            images: [S, 3, H, W] ImageNet-normalised images; H and W multiples of the patch size.

        Returns:
            [S, h*w, C] final-normed patch tokens, float32 (float64 for a float64 model).
        """
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.finish(x)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Patch-embed and add the cls token, positions and registers (before the blocks).

        Args:
            images: [S, 3, H, W] ImageNet-normalised images.

        Returns:
            [S, 1 + R + h*w, C] tokens [cls, registers, patches] in the weight dtype.
        """
        s, _, height, width = images.shape
        h, w = height // self.patch_size, width // self.patch_size
        x = self.patch_embed(images)
        cls = self.cls_token.to(x.dtype).expand(s, -1, -1)
        x = torch.cat([cls, x], dim=1) + self.position_embedding(h, w, x.dtype)
        registers = self.register_tokens.to(x.dtype).expand(s, -1, -1)
        return torch.cat([x[:, :1], registers, x[:, 1:]], dim=1)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the final norm to the blocks' output; drop cls and registers.

        Args:
            x: [S, 1 + R + h*w, C] output of the last block.

        Returns:
            [S, h*w, C] patch tokens, float32 (float64 for a float64 model).
        """
        return self.norm(x)[:, 1 + self.num_registers:]
