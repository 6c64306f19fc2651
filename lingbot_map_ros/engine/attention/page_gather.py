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
"""The paged cache read as dense tokens, and torch SDPA over them: every backend's fallback.

A layout whose visible tokens are not one contiguous range (``page_table.py``) is gathered into a
new ``[K, H, D]`` tensor; ``attend_tokens`` is plain SDPA over such tokens (the ``sdpa`` and
``reference`` backends, the staged forms' eager path and the tests' reference use it).
Shapes: ``Q`` queries, ``K`` visible keys, ``H`` heads, ``D`` head dim, ``N`` pages, ``T`` tokens
per page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from lingbot_map_ros.engine.attention.page_layout import PageLayout


class PageGather:
    """Visible tokens of a layout as a new ``[K, H, D]`` tensor (index built once per layout)."""

    def __init__(self) -> None:
        self._version = -1
        self._index: torch.Tensor | None = None

    def __call__(self, pages: torch.Tensor, layout: PageLayout) -> torch.Tensor:
        """Gather the visible tokens of ``pages: [N, T, H, D]``; returns ``[K, H, D]``."""
        if self._index is None or self._version != layout.version \
                or self._index.device != pages.device:
            self._index = torch.tensor(layout.page_ids, dtype=torch.long, device=pages.device)
            self._version = layout.version
        num_heads, head_dim = pages.shape[2], pages.shape[3]
        tokens = pages.index_select(0, self._index).view(-1, num_heads, head_dim)
        return tokens[:layout.num_tokens]


def attend_tokens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attend ``q [Q, H, D]`` to ``k, v [K, H, D]`` with torch SDPA; returns ``[Q, H, D]``."""
    # [Q, H, D] -> [1, H, Q, D] views; the result goes back to [Q, H, D] (a view).
    out = F.scaled_dot_product_attention(q.unsqueeze(0).transpose(1, 2),
                                         k.unsqueeze(0).transpose(1, 2),
                                         v.unsqueeze(0).transpose(1, 2))
    return out.transpose(1, 2).squeeze(0)
