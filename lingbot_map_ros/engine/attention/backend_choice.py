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
"""Backend ``auto``: the fastest cache attention this device runs for the KV dtype, or a fallback.

Why: at our cache shape on Hopper (docs/performance.md, bench/results/h200_round9/) the
fastest path end to end for FP8 K/V (the default) is FlashAttention-3's FP8 kernel (``fa3``,
the optional ``fa3-fwd`` wheel) over the run cut into parts (``fa3_parts.py``); without that
wheel, and for bf16 K/V, it is our Triton kernel (one contiguous run, its bounds on the device:
no cuDNN/flash split; FP8 K read as stored into an FP8 QK product). So:

* FP8 K/V on a Hopper GPU (compute capability 9.x) with ``fa3-fwd`` installed: ``fa3``;
* where Triton runs (CUDA, compute capability >= 8.0, bf16/fp16, ``triton`` installed):
  ``triton``, for bf16 and FP8 K/V alike (no extra wheel);
* else ``sdpa`` (any device, any dtype; it widens FP8 K/V on read).

It logs its choice and why. An explicit ``triton`` on a device that cannot run it is refused with
the reason (:func:`triton_refusal`), never silently replaced; so is an explicit ``fa3``
(:func:`fa3_refusal`; without its package, ``fa3.import_fa3`` raises ImportError saying what to
install).
"""

from __future__ import annotations

import functools
import importlib.util
import logging

from lingbot_map_ros.engine.attention.fp8 import FP8_KV_DTYPES
import torch

logger = logging.getLogger(__name__)

TRITON_MIN_CAPABILITY = (8, 0)
"""Oldest CUDA compute capability the Triton kernel is built for (Ampere: bf16 tensor cores)."""

FP8_MMA_CAPABILITY = (8, 9)
"""Oldest compute capability with FP8 tensor-core products (Ada, Hopper); Ampere widens K."""


@functools.lru_cache(maxsize=None)
def fp8_products(device: torch.device) -> bool:
    """Return True where an FP8 QK product runs: CUDA >= 8.9, or the CPU interpreter."""
    if device.type != 'cuda':
        return True
    return torch.cuda.get_device_capability(device) >= FP8_MMA_CAPABILITY


def triton_refusal(device_type: str, capability: tuple[int, int] | None, dtype: torch.dtype,
                   triton_installed: bool) -> str | None:
    """Say why the Triton kernel cannot run here, or None where it can.

    Args:
        device_type: 'cuda', 'cpu', ...
        capability: CUDA compute capability ``(major, minor)``; None off CUDA.
        dtype: attention dtype of the cache.
        triton_installed: whether the ``triton`` package imports.

    Returns:
        A sentence naming the missing requirement and the alternative, or None.
    """
    if device_type != 'cuda':
        return (f"backend 'triton' needs a CUDA device, got '{device_type}'; use backend "
                "'sdpa' (any device) or 'auto'")
    if capability is not None and tuple(capability) < TRITON_MIN_CAPABILITY:
        return (f"backend 'triton' needs compute capability >= "
                f'{TRITON_MIN_CAPABILITY[0]}.{TRITON_MIN_CAPABILITY[1]} (bf16 tensor cores), '
                f"this GPU has {capability[0]}.{capability[1]}; use backend 'sdpa' or 'auto'")
    if dtype not in (torch.bfloat16, torch.float16):
        return (f"backend 'triton' attends in bfloat16 or float16, not {dtype}; use backend "
                "'sdpa' or 'reference'")
    if not triton_installed:
        return ("backend 'triton' needs the triton package (it comes with PyTorch's CUDA "
                "wheels); use backend 'sdpa' or 'auto'")
    return None


def fa3_refusal(device_type: str, capability: tuple[int, int] | None,
                dtype: torch.dtype) -> str | None:
    """Say why FlashAttention-3 (built for sm_90 only) cannot run here, or None."""
    if device_type != 'cuda' or capability is None or capability[0] != 9:
        where = device_type if capability is None else f'compute capability {capability[0]}.' \
            f'{capability[1]}'
        return (f"backend 'fa3' needs a Hopper GPU (compute capability 9.x), got {where}; use "
                "backend 'auto', 'triton' or 'sdpa'")
    if dtype not in (torch.bfloat16, torch.float16):
        return (f"backend 'fa3' attends in bfloat16 or float16, not {dtype}; use backend "
                "'sdpa' or 'reference'")
    return None


def choose_backend(device_type: str, capability: tuple[int, int] | None, dtype: torch.dtype,
                   triton_installed: bool, storage_dtype: torch.dtype | None = None,
                   fa3_installed: bool = False) -> tuple[str, str]:
    """Resolve ``auto`` for a cache attending in ``dtype`` with K/V stored in ``storage_dtype``.

    Returns:
        ``('fa3', why)``, ``('triton', why)`` or ``('sdpa', why)`` (module docstring).
    """
    if storage_dtype in FP8_KV_DTYPES and fa3_installed and triton_installed \
            and fa3_refusal(device_type, capability, dtype) is None:
        return 'fa3', ('FlashAttention-3 (fa3-fwd) is installed on this Hopper GPU: its FP8 '
                       'kernel over the run in parts is the fastest measured for FP8 K/V')
    refusal = triton_refusal(device_type, capability, dtype, triton_installed)
    if refusal is None:
        if storage_dtype in FP8_KV_DTYPES:
            return 'triton', ('the Triton kernel runs here; FP8 K/V go as stored into its FP8 '
                              'QK product (fastest measured for FP8 K/V)')
        return 'triton', 'the Triton kernel runs here (fastest measured at the cache shape)'
    return 'sdpa', refusal.split(';')[0].replace("backend 'triton' needs", 'Triton needs')


@functools.lru_cache(maxsize=None)
def fa3_usable() -> bool:
    """Return True where ``fa3-fwd`` imports (a wheel built for another torch may not: logged)."""
    if importlib.util.find_spec('fa3_fwd_interface') is None:
        return False
    try:
        importlib.import_module('fa3_fwd_interface')
    except Exception as exc:  # noqa: BLE001 - any failure to load means: not usable here
        logger.warning("fa3-fwd is installed but does not load (%s: %s); cache.backend 'auto' "
                       'will not use it', type(exc).__name__, exc)
        return False
    return True


def device_facts(device: torch.device) -> tuple[str, tuple[int, int] | None, bool]:
    """Return ``(device type, compute capability or None, triton installed)`` of ``device``."""
    capability = torch.cuda.get_device_capability(device) if device.type == 'cuda' else None
    return device.type, capability, importlib.util.find_spec('triton') is not None


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype,
                    storage_dtype: torch.dtype | None = None) -> str:
    """Return the concrete backend for ``name`` on ``device`` (``auto`` resolved, logged).

    Args:
        name: ``cache.backend``.
        device: Device of the cache.
        dtype: Dtype attention runs in.
        storage_dtype: K/V storage dtype (FP8 or None: ``dtype``); ``auto`` depends on it.

    Raises:
        ValueError: ``triton`` or ``fa3`` asked for explicitly where it cannot run (the message
            says why and what to use instead).
    """
    if name not in ('auto', 'triton', 'fa3'):
        return name
    kind, capability, installed = device_facts(device)
    if name == 'fa3':
        refusal = fa3_refusal(kind, capability, dtype)
        if refusal is not None:
            raise ValueError(refusal)
        return name
    if name == 'triton':
        refusal = triton_refusal(kind, capability, dtype, installed)
        if refusal is not None:
            raise ValueError(refusal)
        return name
    fa3_installed = kind == 'cuda' and fa3_usable()
    chosen, why = choose_backend(kind, capability, dtype, installed, storage_dtype,
                                 fa3_installed)
    logger.info("cache.backend 'auto' -> '%s' (%s)", chosen, why)
    return chosen
