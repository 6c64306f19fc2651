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
"""KVStorage: the K and V tensors of every layer's page pool.

Shapes: ``L`` layers, ``N`` pages per layer, ``T = page_size`` tokens per page, ``H`` heads,
``D`` head dim. Each layer owns two contiguous tensors ``k[l], v[l]: [N, T, H, D]`` (FlashInfer's
NHD paged layout, passed as a ``(k, v)`` tuple). Keeping K and V apart, rather than one
``[N, 2, T, H, D]`` tensor, means that a contiguous range of pages is also one contiguous range
of tokens, so an attention kernel can read the visible run as a plain strided view.

A frame is written with one ``index_copy_`` per tensor: the destination token indices of its
``P`` tokens (specials to the special stream, patches to their page) are computed once per frame
on the device (``frame_index``) and reused by every layer.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


class KVStorage:
    """Per-layer K/V page tensors.

    Args:
        num_layers: Layers (blocks) that share the page structure.
        num_pages: Pages per layer (patch pages, then special pages).
        page_size: Tokens per page.
        num_heads: Attention heads.
        head_dim: Dims per head.
        num_special_tokens: Specials at the start of each frame.
        dtype: Storage dtype (float8_e4m3fn too: 1 byte per element, unit scale).
        device: Storage device.

    Raises:
        ValueError: a size out of range.
    """

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_heads: int,
                 head_dim: int, num_special_tokens: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        for name, value in (('num_layers', num_layers), ('num_pages', num_pages),
                            ('page_size', page_size), ('num_heads', num_heads),
                            ('head_dim', head_dim)):
            if value < 1:
                raise ValueError(f'KV storage: {name}={value} must be >= 1')
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        shape = (num_pages, page_size, num_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # Flat token views [N*T, H, D] of the same memory: the target of index_copy_. FP8 is
        # written through a uint8 view of the same bytes (index_copy_ has no FP8 kernel).
        self._write_view = torch.uint8 if dtype.itemsize == 1 and dtype.is_floating_point \
            else None
        self._k_tokens = [self._as_written(t.view(-1, num_heads, head_dim)) for t in self.k]
        self._v_tokens = [self._as_written(t.view(-1, num_heads, head_dim)) for t in self.v]
        # Token t of a frame: special i = t goes to special_start + i, patch j = t - S goes to
        # patch_start + j; _offsets holds i or j, _is_special selects the base.
        tokens = num_special_tokens + page_size
        self._is_special = (torch.arange(tokens, device=device) < num_special_tokens).long()
        self._offsets = torch.arange(tokens, device=device) \
            - num_special_tokens * (1 - self._is_special)
        logger.info('KV storage: %d layers x %d pages x %d tokens x %d heads x %d dims x '
                    '(K, V) in %s on %s = %.3f GiB', num_layers, num_pages, page_size,
                    num_heads, head_dim, str(dtype).removeprefix('torch.'), device,
                    self.num_bytes / 2**30)

    @property
    def num_bytes(self) -> int:
        """Bytes of all K and V tensors."""
        per_tensor = self.k[0].numel() * self.k[0].element_size()
        return 2 * self.num_layers * per_tensor

    @property
    def bytes_per_page(self) -> int:
        """Bytes of one page of one layer, K and V together."""
        return 2 * self.page_size * self.num_heads * self.head_dim * self.k[0].element_size()

    def frame_index(self, patch_page: int, special_start: int) -> torch.Tensor:
        """Destination token indices of one frame's ``P`` tokens (specials first).

        Args:
            patch_page: Page that receives the patches.
            special_start: Pool token index of the frame's first special.

        Returns:
            int64 tensor ``[P]`` on the storage device.
        """
        patch_start = patch_page * self.page_size
        # Two device ops per frame, no host->device copy: specials get special_start + i,
        # patches get patch_start + j.
        index = torch.add(self._offsets, self._is_special, alpha=special_start - patch_start)
        return index.add_(patch_start)

    def write(self, layer: int, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write one frame's K and V ``[P, H, D]`` of ``layer`` to the tokens ``index``."""
        if k.dtype != self.dtype:
            k = k.to(self.dtype)
        if v.dtype != self.dtype:
            v = v.to(self.dtype)
        self._k_tokens[layer].index_copy_(0, index, self._as_written(k))
        self._v_tokens[layer].index_copy_(0, index, self._as_written(v))

    def _as_written(self, t: torch.Tensor) -> torch.Tensor:
        return t if self._write_view is None else t.view(self._write_view)

    def move_page(self, layer: int, src: int, dst: int) -> None:
        """Copy page ``src`` to page ``dst`` in ``layer`` (K and V)."""
        self.k[layer][dst].copy_(self.k[layer][src])
        self.v[layer][dst].copy_(self.v[layer][src])
