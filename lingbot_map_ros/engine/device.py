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
"""Where and in which dtypes a session runs: the device, the compute and KV dtypes, GPU memory."""

from __future__ import annotations

import torch

from ..config import EngineConfig

_DTYPES = {'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float32': torch.float32}


def resolve_device(config: EngineConfig) -> torch.device:
    """Return the configured device, checked against the machine and the backend.

    Raises:
        ValueError: CUDA asked for but absent, or FlashInfer off CUDA.
    """
    device = torch.device(config.stream.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f"stream.device='{config.stream.device}' but CUDA is not available "
                         'on this machine; set stream.device: cpu')
    if device.type == 'cuda' and device.index is None:
        # Tensors report 'cuda:N'; one spelling keeps device checks exact.
        device = torch.device('cuda', torch.cuda.current_device())
    if config.cache.backend == 'flashinfer' and device.type != 'cuda':
        raise ValueError("cache.backend='flashinfer' needs a CUDA device, got "
                         f"stream.device='{config.stream.device}'; use cache.backend: sdpa")
    return device


def resolve_dtypes(config: EngineConfig,
                   device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """Return (compute dtype, KV attention dtype): float32 on CPU, the configured ones on CUDA.

    An FP8 cache attends in the compute dtype; its storage is FP8 (``new_kv_pool``).
    """
    if device.type != 'cuda':
        return torch.float32, torch.float32
    compute = _DTYPES[config.stream.dtype]
    return compute, _DTYPES.get(config.cache.dtype, compute)


def gpu_memory(device: torch.device) -> dict[str, int]:
    """Return allocated and reserved CUDA memory in bytes (zeros off CUDA)."""
    if device.type != 'cuda':
        return {'gpu_memory_allocated_bytes': 0, 'gpu_memory_reserved_bytes': 0}
    return {'gpu_memory_allocated_bytes': int(torch.cuda.memory_allocated(device)),
            'gpu_memory_reserved_bytes': int(torch.cuda.memory_reserved(device))}
