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
(``triton_attention.py``) needs no copy: it feeds the keys as stored to an FP8 QK product
(queries rounded to e4m3 with a per-row scale) and widens each value tile in registers, to the
dtype :func:`kernel_operand_dtype` names.

The scale is 1 everywhere: stored = e4m3(value), read = widen(stored). There is no per-tensor
or per-page scale to multiply in, in any backend.
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


def kernel_operand_dtype(q_dtype: torch.dtype, k_dtype: torch.dtype,
                         v_dtype: torch.dtype) -> torch.dtype:
    """Return the dtype our Triton kernel widens K/V tiles to (``triton_attention``).

    FP8 K and V with bf16 or fp16 queries: float16 (V always; K and the queries too where the
    QK product is not run in FP8, ``qk_fp8=False``). Every e4m3 value is exact in fp16 (range
    +-448, 3 mantissa bits, subnormals down to 2^-9), so the widening loses nothing, and on
    Hopper it is one instruction per two values where bf16 needs more; bf16 queries are
    exact in fp16 between 2^-14 and 65504. Otherwise (bf16/fp16 storage, or only one of K
    and V in FP8): the queries' dtype, as before.

    Raises:
        ValueError: queries that are not bf16 or fp16, or K/V in a dtype the kernel does not
            read (neither the queries' nor FP8).
    """
    if q_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f'triton attention: queries must be bf16 or fp16, not {q_dtype}')
    for name, dtype in (('k', k_dtype), ('v', v_dtype)):
        if dtype != q_dtype and dtype not in FP8_KV_DTYPES:
            raise ValueError(f'triton attention: {name} is {dtype}; it must be {q_dtype} or '
                             'float8_e4m3fn')
    if k_dtype in FP8_KV_DTYPES and v_dtype in FP8_KV_DTYPES:
        return torch.float16
    return q_dtype
