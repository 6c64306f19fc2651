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
"""Two-part attention for the CUDA ``sdpa`` backend: cuDNN over the patches, flash over specials.

Shapes: ``Q`` queries, ``K1`` patch keys (scale + window pages), ``K2`` special keys, ``H`` heads,
``D`` head dim; tensors are ``[Q|K, H, D]`` as the backends pass them.

Why: cuDNN's fused attention runs this shape much faster than the flash kernel torch ships,
but it builds an execution plan for every new key count, and the plan's host time is paid on
the call (docs/performance.md, 'cuDNN plans'). The special stream grows by 6 keys every
keyframe, so one cuDNN call over all keys would re-plan every frame.
Split at the patch/special boundary instead: once the window is full the patch part has one of
two sizes (keyframe, non-keyframe), so cuDNN plans it once; the small, growing special part runs
on flash. The two partial results are merged exactly with their log-sum-exps (softmax is a sum
over keys, so it splits over any partition of them):

    out = (e^(l1 - m) o1 + e^(l2 - m) o2) / (e^(l1 - m) + e^(l2 - m)),   m = max(l1, l2)
"""

from __future__ import annotations

import logging

import torch

_LOG = logging.getLogger(__name__)


def merge_partial(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor,
                  lse2: torch.Tensor) -> torch.Tensor:
    """Combine attention over two disjoint key sets into attention over their union.

    Args:
        o1: [Q, H, D] softmax-normalised output over the first key set.
        lse1: [H, Q] natural log-sum-exp of the scaled scores over the first key set.
        o2: [Q, H, D] output over the second key set.
        lse2: [H, Q] log-sum-exp over the second key set.

    Returns:
        [Q, H, D] in the dtype of ``o1``.
    """
    wide = torch.promote_types(o1.dtype, torch.float32)
    lse1, lse2 = lse1.to(wide).transpose(0, 1), lse2.to(wide).transpose(0, 1)  # [Q, H]
    top = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - top), torch.exp(lse2 - top)
    total = (w1 + w2).unsqueeze(-1)
    out = (o1.to(wide) * w1.unsqueeze(-1) + o2.to(wide) * w2.unsqueeze(-1)) / total
    return out.to(o1.dtype)


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(0).transpose(1, 2)  # [N, H, D] -> [1, H, N, D] (a view)


def cudnn_part(q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attend ``q [Q, H, D]`` to ``k, v [K, H, D]`` with cuDNN; returns output, LSE ``[H, Q]``."""
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(
        _heads_first(q), _heads_first(k), _heads_first(v), None, True)
    num_q, heads = q.shape[0], q.shape[1]
    return out[0].transpose(1, 2).squeeze(0), out[1].reshape(heads, num_q)


def _flash_part(q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        _heads_first(q), _heads_first(k), _heads_first(v))
    num_q, heads = q.shape[0], q.shape[1]
    return out[0].transpose(1, 2).squeeze(0), out[1].reshape(heads, num_q)


class SplitAttention:
    """cuDNN + flash split of one contiguous key range; disables itself if a kernel refuses."""

    def __init__(self) -> None:
        self.enabled = True
        self.fallbacks = 0
        """Times a kernel refused and the split stepped down to plain SDPA (the fast path's
        fallback count includes it)."""

    def prepare(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                patch_token_counts: tuple[int, ...]) -> None:
        """Build cuDNN's plans for the patch-key counts the split will see.

        Why: cuDNN's first call at a new key count builds its plan, which takes far longer
        than a frame (docs/performance.md, 'cuDNN plans'): a stall in the middle of a stream,
        just when the window fills. Planning at the first frame moves it to the start-up.
        Plans are keyed by shapes and strides, so views of the real pools at the real sizes
        (their contents do not matter) give the plans the split will reuse.

        Args:
            q: [Q, H, D] queries of the real shape.
            k: [K, H, D] token view of a key pool (K >= every count).
            v: [K, H, D] the value pool, likewise.
            patch_token_counts: patch-key counts to plan (keyframe and non-keyframe).
        """
        if not self.usable(q, 1, 2):
            return
        dummy = torch.zeros_like(q)
        for count in patch_token_counts:
            if count <= k.shape[0]:
                try:
                    cudnn_part(dummy, k[:count], v[:count])
                except RuntimeError as err:
                    self.enabled = False
                    self.fallbacks += 1
                    _LOG.warning('cuDNN attention unavailable (%s); using plain SDPA', err)
                    return

    def usable(self, q: torch.Tensor, num_patch_tokens: int, num_tokens: int) -> bool:
        """Whether the split applies: CUDA, half precision, both parts non-empty."""
        return (self.enabled and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)
                and 0 < num_patch_tokens < num_tokens)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 num_patch_tokens: int) -> torch.Tensor | None:
        """Attend ``q`` to ``k, v [K, H, D]`` whose first ``num_patch_tokens`` are patches.

        Returns:
            [Q, H, D], or None when a kernel is unavailable here (the caller falls back; the
            split stays off for the rest of the process, and says so once).
        """
        try:
            o1, lse1 = cudnn_part(q, k[:num_patch_tokens], v[:num_patch_tokens])
            o2, lse2 = _flash_part(q, k[num_patch_tokens:], v[num_patch_tokens:])
        except RuntimeError as err:
            self.enabled = False
            self.fallbacks += 1
            _LOG.warning('split cuDNN/flash attention unavailable (%s); using plain SDPA', err)
            return None
        return merge_partial(o1, lse1, o2, lse2)
