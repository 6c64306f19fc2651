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
"""DPT depth head: four token maps -> full-resolution depth and confidence (spec §7).

Dims: S frames, P = 6 + h*w tokens per frame (6 special tokens first, then patches row-major),
C_in = 2 * embed_dim channels of a tap, H x W the image (h = H / patch, w = W / patch),
F = ``features`` (fusion width).

Pipeline per frame (parameter names as in the official checkpoint, prefix ``depth_head.``):

1. Each of the 4 taps: drop the special tokens, shared ``norm`` (LayerNorm, eps 1e-5), reshape to
   ``[C_in, h, w]``, 1x1 ``projects[i]``, + uv embedding, ``resize_layers[i]`` (ConvT x4, ConvT x2,
   identity (no keys), conv 3x3 stride 2) -> sizes 4h, 2h, h, ceil(h/2).
2. ``scratch.layer{i}_rn`` (3x3, no bias) -> F channels; fusion
   ``refinenet4(l4) -> refinenet3(., l3) -> refinenet2(., l2) -> refinenet1(., l1)``, each
   resizing to the next level (refinenet1: x2), then ``scratch.output_conv1`` (F -> F/2).
3. Bilinear resize to (H, W), + uv embedding, ``scratch.output_conv2`` (3x3 -> 32, ReLU, 1x1 -> 2),
   depth = exp(channel 0), confidence = 1 + exp(channel 1).

Special (all needed for parity with the official numbers):
- The residual conv unit adds ``ReLU(x)``, not ``x``, as its skip (the official ReLU is in-place
  on the block input): ``RCU(x) = conv2(ReLU(conv1(ReLU(x)))) + ReLU(x)``.
- ``refinenet4`` has no ``resConfUnit1`` (no skip input).
- Every bilinear resize uses ``align_corners=True``.
- The uv embedding (5 places) is computed in float64, rounded to float32, scaled by 0.1.
- The head runs with autocast disabled, in its parameters' dtype (float32 unless converted).
- Frames are processed in chunks of ``frames_chunk_size`` (default 1) to bound activation
  memory: the scale pass (phase 1) hands the head its N_s frames at once, and at 504x378 one
  frame's head activations are ~0.3 GB (float32, mostly the full-resolution maps of the last
  fusion steps), so N_s = 8 at once raised the session's peak by ~2.3 GiB
  (docs/gpu_memory.md). Frame by frame, phase 1 needs what a streaming frame needs. Each frame's
  result is the same computation in any chunking; only CPU BLAS/oneDNN kernels, which are
  picked by batch size, can round the last bit differently (test_scale_phase_memory.py).
- :meth:`DPTHead.frame_step` is one frame's head as a pure function of its taps: its shapes
  are fixed per resolution, so the frame runner can compile it and replay its ~100 kernel
  launches as one CUDA graph.
- The uv tables live on the device, cached per size: copying them from the host every frame
  (97 MB at 504x378) would cost more than the rest of the head (docs/performance.md, 'Depth
  head tables').
"""

from __future__ import annotations

from collections.abc import Sequence
import functools
import math

from lingbot_map_ros.config import ModelConfig
import torch
from torch import nn
import torch.nn.functional as F

from ...frames import NUM_SPECIAL_TOKENS

_POS_EMBED_RATIO = 0.1
_POS_EMBED_OMEGA0 = 100.0
_HIDDEN_CHANNELS = 32


@functools.lru_cache(maxsize=32)
def uv_embedding(channels: int, height: int, width: int, aspect: float) -> torch.Tensor:
    """Sin/cos embedding of a normalised uv grid, times 0.1 (cached per size, on the CPU).

    With d = sqrt(aspect^2 + 1), u spans +-(aspect/d)(width-1)/width over the columns and v spans
    +-(1/d)(height-1)/height over the rows; with omega_k = 100^(-k / (channels/4)),
    k < channels/4, the channels are ``[sin(u w), cos(u w), sin(v w), cos(v w)]``.

    Args:
        channels: embedding channels; a multiple of 4.
        height: grid rows.
        width: grid columns.
        aspect: image width / image height (of the whole image, not of the grid).

    Returns:
        [channels, height, width] float32 (computed in float64, then rounded).

    Raises:
        ValueError: ``channels`` is not a positive multiple of 4.
    """
    if channels < 4 or channels % 4:
        raise ValueError(f'uv_embedding: channels={channels} must be a positive multiple of 4')
    diag = math.sqrt(aspect * aspect + 1.0)
    span_u = aspect / diag * (width - 1) / width
    span_v = 1.0 / diag * (height - 1) / height
    u = torch.linspace(-span_u, span_u, width, dtype=torch.float64)
    v = torch.linspace(-span_v, span_v, height, dtype=torch.float64)
    quarter = channels // 4
    omega = 1.0 / _POS_EMBED_OMEGA0 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    uw = u[None, None, :] * omega[:, None, None]  # [C/4, 1, w]
    vw = v[None, :, None] * omega[:, None, None]  # [C/4, h, 1]
    shape = (quarter, height, width)
    emb = torch.cat([torch.sin(uw).expand(shape), torch.cos(uw).expand(shape),
                     torch.sin(vw).expand(shape), torch.cos(vw).expand(shape)], dim=0)
    return (emb.to(torch.float32) * _POS_EMBED_RATIO).contiguous()


@functools.lru_cache(maxsize=32)
def _uv_embedding_on(channels: int, height: int, width: int, aspect: float,
                     device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    # Kept on the device: a host-to-device copy per frame would dominate the head's time.
    return uv_embedding(channels, height, width, aspect).to(device=device, dtype=dtype)


def _resize(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    return F.interpolate(x, size=size, mode='bilinear', align_corners=True)


class ResidualConvUnit(nn.Module):
    """``conv2(ReLU(conv1(ReLU(x)))) + ReLU(x)``: the skip carries ReLU(x) (official quirk)."""

    def __init__(self, features: int) -> None:
        """Build two 3x3 convolutions with bias.

        Args:
            features: channel count in and out.
        """
        super().__init__()
        self.conv1 = nn.Conv2d(features, features, 3, padding=1)
        self.conv2 = nn.Conv2d(features, features, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the unit.

        Args:
            x: [S, F, h, w].

        Returns:
            [S, F, h, w].
        """
        x = F.relu(x)
        return self.conv2(F.relu(self.conv1(x))) + x


class FusionBlock(nn.Module):
    """``out_conv(resize(RCU2(x + RCU1(skip))))``; without ``resConfUnit1`` when no skip."""

    def __init__(self, features: int, has_skip: bool = True) -> None:
        """Build the units.

        Args:
            features: channel count F.
            has_skip: build ``resConfUnit1`` for a skip input (False for ``refinenet4``).
        """
        super().__init__()
        self.resConfUnit1 = ResidualConvUnit(features) if has_skip else None
        self.resConfUnit2 = ResidualConvUnit(features)
        self.out_conv = nn.Conv2d(features, features, 1)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None,
                size: tuple[int, int]) -> torch.Tensor:
        """Fuse, refine and resize.

        Args:
            x: [S, F, h, w] coarser path.
            skip: [S, F, h, w] lateral input, or None (only without ``resConfUnit1``).
            size: (rows, cols) to resize to.

        Returns:
            [S, F, size[0], size[1]].

        Raises:
            ValueError: ``skip`` given to a block without ``resConfUnit1`` or vice versa.
        """
        if (skip is None) != (self.resConfUnit1 is None):
            raise ValueError('FusionBlock: skip input and resConfUnit1 must both be present or '
                             f'both absent (skip is {"None" if skip is None else "given"})')
        if skip is not None:
            x = x + self.resConfUnit1(skip)
        return self.out_conv(_resize(self.resConfUnit2(x), size))


class DPTScratch(nn.Module):
    """The ``scratch`` submodule: level convs, the fusion chain and the output convs."""

    def __init__(self, in_channels: Sequence[int], features: int, output_dim: int) -> None:
        """Build the layers (names as in the checkpoint).

        Args:
            in_channels: channels of the 4 levels (``out_channels`` of the head).
            features: fusion width F.
            output_dim: channels of the final 1x1 conv (2: depth and confidence logits).
        """
        super().__init__()
        for i, channels in enumerate(in_channels, start=1):
            setattr(self, f'layer{i}_rn', nn.Conv2d(channels, features, 3, padding=1,
                                                    bias=False))
        self.refinenet1 = FusionBlock(features)
        self.refinenet2 = FusionBlock(features)
        self.refinenet3 = FusionBlock(features)
        self.refinenet4 = FusionBlock(features, has_skip=False)
        self.output_conv1 = nn.Conv2d(features, features // 2, 3, padding=1)
        self.output_conv2 = nn.Sequential(
            nn.Conv2d(features // 2, _HIDDEN_CHANNELS, 3, padding=1), nn.ReLU(),
            nn.Conv2d(_HIDDEN_CHANNELS, output_dim, 1))

    def fuse(self, levels: Sequence[torch.Tensor]) -> torch.Tensor:
        """Fuse the 4 resized levels (finest first) into one map at twice the finest size.

        Args:
            levels: [S, out_channels[i], h_i, w_i] for i = 0..3.

        Returns:
            [S, F/2, 2 h_0, 2 w_0] (after ``output_conv1``).
        """
        l1, l2, l3, l4 = (getattr(self, f'layer{i}_rn')(x) for i, x in enumerate(levels, 1))
        out = self.refinenet4(l4, None, l3.shape[-2:])
        out = self.refinenet3(out, l3, l2.shape[-2:])
        out = self.refinenet2(out, l2, l1.shape[-2:])
        out = self.refinenet1(out, l1, (2 * l1.shape[-2], 2 * l1.shape[-1]))
        return self.output_conv1(out)


class DPTHead(nn.Module):
    """Depth + confidence from the 4 tapped aggregator layers."""

    def __init__(self, dim_in: int = 2048, patch_size: int = 14, features: int = 256,
                 out_channels: Sequence[int] = (256, 512, 1024, 1024),
                 frames_chunk_size: int = 1) -> None:
        """Build the head (defaults: the official model).

        Args:
            dim_in: channels of a tap, ``2 * embed_dim``.
            patch_size: pixels per patch side.
            features: fusion width F (even, F/2 a multiple of 4 for the uv embedding).
            out_channels: the 4 per-level projection widths (multiples of 4).
            frames_chunk_size: frames per chunk in :meth:`forward` (1: one frame's
                activations at a time; larger chunks cost memory for no measured speed).

        Raises:
            ValueError: bad widths or chunk size.
        """
        super().__init__()
        if len(out_channels) != 4 or any(c < 4 or c % 4 for c in out_channels):
            raise ValueError(f'DPTHead: out_channels={tuple(out_channels)} must be 4 positive '
                             'multiples of 4')
        if features < 8 or features % 8:
            raise ValueError(f'DPTHead: features={features} must be a positive multiple of 8')
        if frames_chunk_size < 1:
            raise ValueError(f'DPTHead: frames_chunk_size={frames_chunk_size} must be >= 1')
        self.patch_size = patch_size
        self.frames_chunk_size = frames_chunk_size
        self.norm = nn.LayerNorm(dim_in, eps=1e-5)
        self.projects = nn.ModuleList(nn.Conv2d(dim_in, c, 1) for c in out_channels)
        self.resize_layers = nn.ModuleList([
            nn.ConvTranspose2d(out_channels[0], out_channels[0], 4, stride=4),
            nn.ConvTranspose2d(out_channels[1], out_channels[1], 2, stride=2),
            nn.Identity(),
            nn.Conv2d(out_channels[3], out_channels[3], 3, stride=2, padding=1),
        ])
        self.scratch = DPTScratch(out_channels, features, output_dim=2)

    @classmethod
    def from_config(cls, config: ModelConfig) -> 'DPTHead':
        """Build the head for a model configuration (official or 'tiny')."""
        return cls(dim_in=2 * config.embed_dim, patch_size=config.patch_size,
                   features=config.depth_features, out_channels=config.depth_out_channels)

    def forward(self, features: Sequence[torch.Tensor], image_size_hw: tuple[int, int],
                frames_chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Predict depth and confidence for every frame.

        Args:
            features: the 4 taps (layers 4, 11, 17, 23 of the official model), each
                [S, P, C_in] with P = 6 + (H/patch)(W/patch); any float dtype.
            image_size_hw: (H, W) of the processed image.
            frames_chunk_size: frames per chunk; None uses the constructor's value.

        Returns:
            ``(depth [S, H, W], conf [S, H, W])`` in the parameters' dtype; depth > 0 (non-metric,
            along the optical axis), conf > 1.

        Raises:
            ValueError: wrong number of taps, shapes that do not fit ``image_size_hw``.
        """
        grid_hw = self.check_inputs(features, image_size_hw)
        chunk = frames_chunk_size or self.frames_chunk_size
        dtype = self.norm.weight.dtype
        num_frames = features[0].shape[0]
        depths, confs = [], []
        uv = self.uv_tables(grid_hw, image_size_hw, features[0].device)
        with torch.autocast(device_type=features[0].device.type, enabled=False):
            for start in range(0, num_frames, chunk):
                taps = [f[start:start + chunk].to(dtype) for f in features]
                depth, conf = self._forward_frames(taps, grid_hw, image_size_hw, uv)
                depths.append(depth)
                confs.append(conf)
        return torch.cat(depths), torch.cat(confs)

    def uv_tables(self, grid_hw: tuple[int, int], image_size_hw: tuple[int, int],
                  device: torch.device) -> list[torch.Tensor]:
        """Return the 5 uv embeddings of a frame size: 4 levels (grid size), then the output.

        Looked up outside any compiled or captured region: Dynamo traces through the cache
        wrapper, which would put the float64 CPU computation and its copy into the graph.
        """
        aspect = image_size_hw[1] / image_size_hw[0]
        dtype = self.norm.weight.dtype
        sizes = [(project.out_channels, *grid_hw) for project in self.projects]
        sizes.append((self.scratch.output_conv1.out_channels, *image_size_hw))
        return [_uv_embedding_on(c, h, w, aspect, device, dtype) for c, h, w in sizes]

    def frame_step(self, taps: Sequence[torch.Tensor], grid_hw: tuple[int, int],
                   image_size_hw: tuple[int, int],
                   uv: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head on the frames of ``taps`` in one chunk (a pure function, fixed shapes).

        ``grid_hw`` from :meth:`check_inputs`, ``uv`` from :meth:`uv_tables`; call under
        ``torch.autocast(enabled=False)``, as :meth:`forward` runs.
        """
        dtype = self.norm.weight.dtype
        return self._forward_frames([t.to(dtype) for t in taps], grid_hw, image_size_hw, uv)

    def check_inputs(self, features: Sequence[torch.Tensor],
                     image_size_hw: tuple[int, int]) -> tuple[int, int]:
        """Return the patch grid (h, w) of ``image_size_hw``; ValueError if a tap misfits."""
        height, width = image_size_hw
        if height < self.patch_size or width < self.patch_size or height % self.patch_size \
                or width % self.patch_size:
            raise ValueError(f'DPTHead: image_size_hw={image_size_hw} must be positive multiples '
                             f'of patch_size={self.patch_size}')
        grid_hw = (height // self.patch_size, width // self.patch_size)
        want = (NUM_SPECIAL_TOKENS + grid_hw[0] * grid_hw[1], self.norm.normalized_shape[0])
        shapes = [tuple(f.shape) for f in features]
        if len(shapes) != 4 or any(len(s) != 3 or s[1:] != want or s[0] != shapes[0][0]
                                   for s in shapes):
            raise ValueError(f'DPTHead: expected 4 taps of shape [S, {want[0]}, {want[1]}] for '
                             f'image_size_hw={image_size_hw}, got {shapes}')
        return grid_hw

    def _forward_frames(self, taps: list[torch.Tensor], grid_hw: tuple[int, int],
                        image_size_hw: tuple[int, int],
                        uv: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        levels = []
        for tap, project, resize, uv_level in zip(taps, self.projects, self.resize_layers, uv):
            x = self.norm(tap[:, NUM_SPECIAL_TOKENS:])
            x = x.permute(0, 2, 1).reshape(x.shape[0], x.shape[2], *grid_hw)
            levels.append(resize(project(x) + uv_level))
        out = _resize(self.scratch.fuse(levels), image_size_hw)
        out = self.scratch.output_conv2(out + uv[-1])
        return torch.exp(out[:, 0]), 1.0 + torch.exp(out[:, 1])
