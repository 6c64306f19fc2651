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
"""Backend ``fa3``: FlashAttention-3's forward (the ``fa3-fwd`` wheel) over the visible run.

Shapes: ``Q`` queries, ``H`` heads, ``D`` head dim; keys and values as token views ``[N, H, D]``
of a layer's pool, the visible run ``[start, stop)`` in the device tensor ``bounds``.

Why: at our cache shape FA3 with automatic KV splits was the fastest bf16 kernel measured
(bench/results/h200_speed/: 0.693 ms, 422 TFLOP/s, against 0.721 ms for our Triton kernel), and
its FP8 path the fastest of all (0.552 ms, 529 TFLOP/s, relative error 5.6e-2 on random
inputs). It runs as the ``triton`` backend does (``TritonBackend``: one launch per layer, inside
the whole-frame graph), with FA3's varlen entry: ``cu_seqlens_k = bounds`` makes it read keys
``[start, stop)`` of the whole pool, so no shape depends on the frame.

FP8 pools (``cache.dtype: float8_e4m3fn``, unit scale) run FA3's FP8 kernel: QK and PV on the
FP8 tensor cores, K and V read as stored (no widening pass, no copy). The queries are cast to
e4m3 with one scale per head (``triton_quant.quantize_queries``: one launch, the head's max at
448), the K/V descales are 1 (the storage's unit scale, ``fp8.py``); FA3 rounds the softmax
probabilities to e4m3 for PV itself. Its output is bf16.

Measured (bench/results/h200_round6/): through this varlen entry FA3 is slower than through
its plain entry (bf16 0.855 ms against 0.687, FP8 0.745 with the query cast against 0.553), and
end to end slower than our Triton kernel (FP8 K/V 29.12 ms per frame, bf16 30.85, against
27.20 for Triton in bf16), so ``auto`` does not pick it; it stays selectable for comparison.
Hopper only (FA3 is built for sm_90); the wheel is not a dependency (built for torch 2.10,
runs under 2.11 on the H200).
"""

from __future__ import annotations

from typing import Any

from lingbot_map_ros.engine.attention.triton_backend import TritonBackend
import torch


def import_fa3() -> Any:
    """Import FA3's varlen forward, or raise ImportError saying what to install.

    Raises:
        ImportError: the ``fa3-fwd`` package is not installed.
    """
    try:
        from fa3_fwd_interface import flash_attn_varlen_func
    except ImportError as exc:
        raise ImportError("attention backend 'fa3' needs the fa3-fwd package "
                          '(FlashAttention-3 forward for Hopper: pip install fa3-fwd); or '
                          "choose backend 'auto', 'triton' or 'sdpa'") from exc
    return flash_attn_varlen_func


class Fa3RunAttention:
    """FA3 over a device-side run ``(q, k, v, bounds)``, the ``triton`` kernel's signature.

    Args:
        num_splits: FA3's KV splits; 0 lets its heuristic choose (fastest measured).
    """

    def __init__(self, num_splits: int = 0) -> None:
        self._attend = import_fa3()
        self._num_splits = num_splits
        self._cu_q: torch.Tensor | None = None
        self._cu_q_len = -1
        self._ones: torch.Tensor | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 bounds: torch.Tensor) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to ``k[start:stop]``, ``v[start:stop]``; ``[Q, H, D]``."""
        num_q, heads = q.shape[0], q.shape[1]
        if self._cu_q is None or self._cu_q_len != num_q or self._cu_q.device != q.device:
            self._cu_q = torch.tensor([0, num_q], dtype=torch.int32, device=q.device)
            self._cu_q_len = num_q
        extra: dict[str, Any] = {}
        out_dtype = q.dtype
        if k.dtype == torch.float8_e4m3fn:
            from lingbot_map_ros.engine.attention.triton_quant import quantize_queries
            if self._ones is None or self._ones.shape[1] != heads \
                    or self._ones.device != q.device:
                self._ones = torch.ones(1, heads, dtype=torch.float32, device=q.device)
            q, q_descale = quantize_queries(q)
            extra = {'q_descale': q_descale, 'k_descale': self._ones,
                     'v_descale': self._ones}
        # The bounds are int32 [start, stop] on the device: sequence 0's keys start at
        # cu_seqlens_k[0]. max_seqlen_k is an upper bound fixed per pool, so the launch (and a
        # graph of it) does not depend on the frame.
        out = self._attend(q, k, v, self._cu_q, bounds[0:2], num_q, k.shape[0],
                           num_splits=self._num_splits, **extra)
        out = out[0] if isinstance(out, tuple) else out
        return out if out.dtype == out_dtype else out.to(out_dtype)


class Fa3Backend(TritonBackend):
    """Backend ``fa3``: the ``triton`` backend's run handling with FA3 as the kernel."""

    name = 'fa3'

    def __init__(self, device: torch.device) -> None:
        super().__init__(device, kernel=Fa3RunAttention())
