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
"""FP8 (e4m3) KV storage: which dtypes count as FP8 and how a backend widens them on read.

The cache may store K and V in ``float8_e4m3fn`` with a unit scale (``cache.dtype``): half the
bytes of bf16. Post-RoPE keys and values of the model stay far inside e4m3's range (+-448), so
no scale is needed; the cost is the rounding (3 mantissa bits; docs/gpu_memory.md gives the
measured effect on golden set A). Torch's SDPA kernels do not take FP8 operands, so the
``sdpa`` and ``reference`` backends widen the visible run to the attention dtype before the
kernel (one extra pass over those bytes); a kernel that reads FP8 itself
(``triton_attention.py``) needs no copy.
"""

from __future__ import annotations

import torch

FP8_KV_DTYPES = (torch.float8_e4m3fn,)
"""Storage dtypes that are widened on read."""


def is_fp8(t: torch.Tensor) -> bool:
    """Whether ``t`` is stored in an FP8 KV dtype."""
    return t.dtype in FP8_KV_DTYPES


def widen(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` if it is FP8 (a new tensor), else ``t`` itself."""
    return t.to(dtype) if is_fp8(t) else t


def attention_dtype(q: torch.Tensor, pages: torch.Tensor) -> torch.dtype:
    """Return the dtype attention runs in: the pool's, or the queries' for an FP8 pool."""
    return q.dtype if is_fp8(pages) else pages.dtype
