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
"""The ``sdpa`` backend's capturable attention: flash varlen over a device range, then a split.

Shapes: ``Q`` queries, ``H`` heads, ``D`` head dim; ``k, v`` are a layer's flat token views
``[N*T, H, D]`` (``staged.py``).

* ``('range',)``: one flash varlen call whose key range is ``cu_seqlens_k = [start, stop]``
  read on the device (flash takes the keys of "sequence 0" from offset ``cu_seqlens_k[0]``).
  Any layout; the window-fill phase uses it;
* ``('split', start, patches)``: once the window is full the patch run has one of two fixed
  places (keyframe: the ``N_s + W`` pages above the spare one; non-keyframe: those plus the
  spare page), so cuDNN runs it at a fixed shape (~1.75x the flash kernel's speed,
  ``split.py``) and the special stream, which grows by 6 keys per keyframe, goes to flash
  varlen over ``[R*T, stop)``. The two are merged by log-sum-exp. The split shares the
  backend's :class:`SplitAttention` switch: once a cuDNN call has been refused (and counted
  there), full-window frames take ``range`` too.
"""

from __future__ import annotations

from lingbot_map_ros.engine.attention.fp8 import widen
from lingbot_map_ros.engine.attention.split import cudnn_part, merge_partial, SplitAttention
from lingbot_map_ros.engine.attention.staged import StagedAttention, StagedKey
import torch


def _flash_range(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                 cu_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash varlen over keys ``k[cu_k[0]:cu_k[1]]``, the bounds read on the device.

    Returns:
        ``([Q, H, D], [H, Q])``: output and natural log-sum-exp.
    """
    num_q, heads = q.shape[0], q.shape[1]
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, num_q, k.shape[0], 0.0, False, False)
    return out, lse.reshape(heads, num_q)


class SdpaStagedAttention(StagedAttention):
    """Flash varlen over the staged range; cuDNN + flash split over a full window.

    Args:
        split: the backend's cuDNN/flash split (one switch for its eager and staged use).
        compile_merge: ``torch.compile`` the log-sum-exp merge (one fused kernel, not ~12).
        Others: as :class:`StagedAttention`.
    """

    def __init__(self, split: SplitAttention, page_size: int, full_patch_pages: int,
                 num_special_tokens: int, device: torch.device,
                 compile_merge: bool = False) -> None:
        super().__init__(page_size, full_patch_pages, num_special_tokens, device)
        self._split = split
        self._cu_q: torch.Tensor | None = None  # [0, Q]; built before any capture
        self._cu_q_len = -1
        self._merge = torch.compile(merge_partial, dynamic=False, fullgraph=True) \
            if compile_merge else merge_partial

    def warm_up(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor) -> None:
        """Compile the merge and build the queries' ``cu_seqlens`` for ``q: [Q, H, D]`` now."""
        if self._merge is not merge_partial and q.is_cuda:
            lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
            self._merge(q, lse, q, lse)
        self._queries(q)

    def full_window_key(self, start: int, patches: int) -> StagedKey:
        """Return the ``split`` key while the split is on (CUDA), else ``('range',)``."""
        if self._split.enabled and self._bounds.is_cuda:
            return ('split', start, patches)
        return ('range',)

    def attend_device(self, key: StagedKey, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor) -> torch.Tensor:
        """Flash over the range, or cuDNN over the fixed patch run + flash over the specials."""
        # An FP8 pool is widened whole (a fixed shape, so the graph stays one graph).
        k, v = widen(k, q.dtype), widen(v, q.dtype)
        cu_q = self._queries(q)
        if key[0] == 'range':
            return _flash_range(q, k, v, cu_q, self._bounds[0:2])[0]
        _, start, patches = key
        o1, lse1 = cudnn_part(q, k[start:start + patches], v[start:start + patches])
        o2, lse2 = _flash_range(q, k, v, cu_q, self._bounds[2:4])
        return self._merge(o1, lse1, o2, lse2)

    def _queries(self, q: torch.Tensor) -> torch.Tensor:
        if self._cu_q is None or self._cu_q_len != q.shape[0]:
            self._cu_q = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
            self._cu_q_len = q.shape[0]
        return self._cu_q
