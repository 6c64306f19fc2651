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
"""Backend ``auto`` and ``cache.precision``: the fastest faithful cache attention, or a fallback.

Faithful means within the long-sequence fidelity gate (docs/performance.md, ``lingbot_map_bench
fidelity``): over 120 real frames each mean error at most, and each maximum at most 1.25 times,
what the official model's own bf16 run shows against its fp32 run. Storing K/V in FP8 passes;
an 8-bit QK product with the queries rounded once to e4m3 does not (FA3's FP8 kernel: 7.5 times
the official bf16 error; our Triton kernel with one row-scaled e4m3 term: 1.8 times). Such
products run only under ``cache.precision: fast_approximate``, which logs a warning.

``auto`` under ``faithful``:

* FP8 K/V where Triton runs: ``triton`` (FP8 keys as stored meet the queries carried in two
  e4m3 terms, about bf16's query precision: ``triton_attention.py``; on Ampere the keys are
  widened);
* bf16 K/V on a Hopper GPU with ``fa3-fwd`` installed: ``fa3`` (its bf16 kernel);
* else ``triton`` where it runs, else ``sdpa`` (any device, any dtype; it widens FP8 on read).

Under ``fast_approximate`` FP8 K/V on Hopper with ``fa3-fwd`` take ``fa3``'s FP8 kernel.

It logs its choice and why. An explicit ``triton`` on a device that cannot run it is refused with
the reason (:func:`triton_refusal`), never silently replaced; so is an explicit ``fa3``
(:func:`fa3_refusal`, and with FP8 K/V under ``faithful``; without its package,
``fa3.import_fa3`` raises ImportError saying what to install).
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


PRECISIONS = ('faithful', 'fast_approximate')
"""``cache.precision`` values (module docstring)."""


def unfaithful_refusal(backend: str, storage_dtype: torch.dtype | None,
                       precision: str) -> str | None:
    """Say why ``backend`` over ``storage_dtype`` K/V is outside the fidelity gate, or None."""
    if precision == 'faithful' and backend == 'fa3' and storage_dtype in FP8_KV_DTYPES:
        return ("backend 'fa3' with cache.dtype float8_e4m3fn runs FA3's FP8 kernel (queries "
                'rounded to e4m3), 7.5 times the official bf16 pose error on the long-sequence '
                "fidelity gate (docs/performance.md); use backend 'auto' or 'triton' (FP8 "
                "storage, faithful products), cache.dtype bfloat16 with 'fa3', or "
                'cache.precision fast_approximate to accept the error')
    return None


def choose_backend(device_type: str, capability: tuple[int, int] | None, dtype: torch.dtype,
                   triton_installed: bool, storage_dtype: torch.dtype | None = None,
                   fa3_installed: bool = False, precision: str = 'faithful') -> tuple[str, str]:
    """Resolve ``auto`` for a cache attending in ``dtype`` with K/V stored in ``storage_dtype``.

    Returns:
        ``('fa3', why)``, ``('triton', why)`` or ``('sdpa', why)`` (module docstring); never a
        combination :func:`unfaithful_refusal` refuses under ``precision``.
    """
    fp8 = storage_dtype in FP8_KV_DTYPES
    fa3_runs = fa3_installed and triton_installed \
        and fa3_refusal(device_type, capability, dtype) is None
    if fa3_runs and unfaithful_refusal('fa3', storage_dtype, precision) is None:
        if fp8:
            return 'fa3', ('cache.precision fast_approximate and FlashAttention-3 (fa3-fwd) on '
                           'this Hopper GPU: its FP8 kernel, the fastest measured for FP8 K/V')
        return 'fa3', ('FlashAttention-3 (fa3-fwd) is installed on this Hopper GPU: its bf16 '
                       'kernel is the fastest faithful one measured for bf16 K/V')
    refusal = triton_refusal(device_type, capability, dtype, triton_installed)
    if refusal is None:
        if fp8:
            how = 'one e4m3 query term' if precision == 'fast_approximate' \
                else 'queries in two e4m3 terms (faithful)'
            return 'triton', (f'the Triton kernel runs here; FP8 keys go as stored into its FP8 '
                              f'QK product, {how}')
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
                    storage_dtype: torch.dtype | None = None, precision: str = 'faithful') -> str:
    """Return the concrete backend for ``name`` on ``device`` (``auto`` resolved, logged).

    Args:
        name: ``cache.backend``.
        device: Device of the cache.
        dtype: Dtype attention runs in.
        storage_dtype: K/V storage dtype (FP8 or None: ``dtype``); ``auto`` depends on it.
        precision: ``cache.precision`` (:data:`PRECISIONS`); ``fast_approximate`` is logged as
            a warning.

    Raises:
        ValueError: an unknown precision; ``triton`` or ``fa3`` asked for explicitly where it
            cannot run, or ``fa3`` with FP8 K/V under ``faithful`` (the message says why and
            what to use instead).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"cache.precision='{precision}' is not one of {', '.join(PRECISIONS)}")
    if precision == 'fast_approximate':
        logger.warning('cache.precision fast_approximate: FP8 attention products with the '
                       'queries rounded once to e4m3 are allowed. On the long-sequence fidelity '
                       'gate they give several times the pose error of the official bf16 run '
                       '(FA3 FP8: 7.5x); use it only where speed matters more than accuracy '
                       '(docs/performance.md)')
    if name not in ('auto', 'triton', 'fa3'):
        return name
    kind, capability, installed = device_facts(device)
    if name == 'fa3':
        refusal = fa3_refusal(kind, capability, dtype) \
            or unfaithful_refusal(name, storage_dtype, precision)
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
                                 fa3_installed, precision)
    logger.info("cache.backend 'auto' -> '%s' (%s)", chosen, why)
    return chosen
