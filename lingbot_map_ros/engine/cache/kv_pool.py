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
"""KVPool: one KV storage per engine (per device); streams lease pages of it.

Shapes: ``L`` layers, ``N`` pool pages per layer, ``T = page_size`` tokens per page (one frame's
patches), ``H`` heads, ``D`` head dim. The storage is ``KVStorage``: per layer K and V
``[N, T, H, D]`` each, allocated once when the pool is built (the first frame of a size).

A stream (a camera's session, a rollover's next session) leases one contiguous extent of
``N_s + W + 1`` patch pages followed by its special pages (``stream_kv.py``), and returns it on
reset, rollover or end. The extent is contiguous on purpose: a stream's visible keys then stay
one contiguous token range (``page_table.py``), which the ``sdpa`` backend reads in place and
the staged whole-frame graphs address by two device numbers. Page-by-page leasing (vLLM's block
pool) would scatter a stream's pages and cost a gather per layer. Inside its extent a stream's
table places every page itself; the pool records which stream owns each page (``PagePool``),
so no stream can write another's pages, and a lease that does not fit is refused with
``PoolExhaustedError`` before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
import itertools
import logging

import torch

from .kv_storage import KVStorage
from .page_pool import PagePool
from ..attention.backend import AttentionBackend, check_storage_dtype, make_backend
from ..attention.backend_choice import resolve_backend
from ..errors import PoolExhaustedError
from ...kernel_config import KernelConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PageLease:
    """Pages ``[first_page, first_page + num_pages)`` of a pool, held by one stream."""

    stream: int
    """Id of the stream holding the lease."""
    first_page: int
    """First pool page of the extent."""
    num_pages: int
    """Pages of the extent (patch pages, then special pages)."""


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Occupancy of an engine's page pool (per layer: every layer has the same pages)."""

    pool_pages_total: int
    """Pages of the pool."""
    pool_pages_free: int
    """Pages no stream holds."""
    pool_streams: int
    """Streams holding a lease."""


class KVPool:
    """Per-layer K/V pages shared by the streams of one engine, and who holds which.

    Args:
        num_layers: Global attention blocks.
        num_pages: Pages per layer.
        page_size: ``T``, patch tokens per frame.
        num_heads: ``H``.
        head_dim: ``D``.
        num_special_tokens: Specials at the start of each frame.
        dtype: Attention dtype of the K/V.
        device: Where the pages live.
        backend: Attention backend name ('flashinfer', 'sdpa', 'reference', 'triton', 'fa3',
            'auto'), or a backend already built (the attention conformance tests drive one
            the name would refuse on this device: Triton under ``TRITON_INTERPRET=1``).
        storage_dtype: K/V storage dtype when it differs from ``dtype`` (FP8).
        full_patch_pages: ``N_s + W``, for the backend's split (``attention/split.py``).
        precision: ``cache.precision``: 'faithful' (products within the fidelity gate) or
            'fast_approximate' (``backend_choice.py``).
        kernel: ``cache.kernel``, the kernels' tuning (None: the defaults).

    Raises:
        ValueError: bad sizes, dtypes or backend.
        ImportError: the backend's package is missing.
    """

    def __init__(self, *, num_layers: int, num_pages: int, page_size: int, num_heads: int,
                 head_dim: int, num_special_tokens: int, dtype: torch.dtype,
                 device: torch.device, backend: str | AttentionBackend,
                 storage_dtype: torch.dtype | None = None,
                 full_patch_pages: int = 0, precision: str = 'faithful',
                 kernel: KernelConfig | None = None) -> None:
        self.page_size = page_size
        self.num_special_tokens = num_special_tokens
        self.tokens_per_frame = num_special_tokens + page_size
        self.dtype = dtype
        self.device = torch.device(device)
        built = None if isinstance(backend, str) else backend
        if built is not None:
            backend = built.name
        else:
            # 'auto' -> the fastest backend this device runs; 'triton' refused where it cannot.
            backend = resolve_backend(backend, self.device, dtype, storage_dtype, precision)
        self.backend_name = backend
        self.precision = precision
        self.kernel = kernel or KernelConfig()
        """``cache.kernel``: what the backend's kernels and the batches' forms were built with."""
        self.storage_dtype = check_storage_dtype(storage_dtype, dtype, backend)
        self.full_patch_pages = full_patch_pages
        # The backend first: a missing FlashInfer fails before gigabytes are allocated.
        self.backend: AttentionBackend = built if built is not None else make_backend(
            backend, num_heads=num_heads, head_dim=head_dim, page_size=page_size,
            num_pages=num_pages, dtype=dtype, device=self.device,
            full_patch_pages=full_patch_pages, precision=precision, kernel=self.kernel)
        self.storage = KVStorage(num_layers, num_pages, page_size, num_heads, head_dim,
                                 num_special_tokens, self.storage_dtype, self.device)
        self._owners = PagePool(num_pages, 'KV pool')
        self._leases: dict[int, PageLease] = {}
        self._stream_ids = itertools.count()
        self.versions = itertools.count(1)
        """Layout versions shared by every stream's table (a version names one layout)."""

    @property
    def num_pages(self) -> int:
        """Pages per layer."""
        return self._owners.num_pages

    @property
    def num_free(self) -> int:
        """Pages no stream holds."""
        return self._owners.num_free

    @property
    def num_streams(self) -> int:
        """Streams holding a lease."""
        return len(self._leases)

    def stats(self) -> PoolStats:
        """Return the pool's occupancy."""
        return PoolStats(self.num_pages, self.num_free, self.num_streams)

    def new_stream_id(self) -> int:
        """Return an id no stream of this pool has used."""
        return next(self._stream_ids)

    def lease(self, stream: int, num_pages: int) -> PageLease:
        """Give ``stream`` the lowest free extent of ``num_pages`` contiguous pages.

        Raises:
            PoolExhaustedError: no free extent that long (nothing changed).
            ValueError: ``stream`` already holds a lease, or ``num_pages`` < 1.
        """
        if stream in self._leases:
            raise ValueError(f'KV pool: stream {stream} already holds {self._leases[stream]}')
        if num_pages < 1:
            raise ValueError(f'KV pool: a lease of {num_pages} pages')
        first = self._find_extent(num_pages)
        if first < 0:
            raise PoolExhaustedError(
                f'KV page pool full: a stream needs {num_pages} contiguous pages, '
                f'{self.num_free} of {self.num_pages} are free ({self.num_streams} streams '
                'hold the rest); end or reset a stream, or raise cache.pool_pages / '
                'cache.streams')
        for page in range(first, first + num_pages):
            self._owners.allocate(stream, page)
        lease = PageLease(stream, first, num_pages)
        self._leases[stream] = lease
        return lease

    def release(self, lease: PageLease) -> None:
        """Return a lease's pages to the pool (their contents are left as they are).

        Raises:
            ValueError: the lease is not held.
        """
        if self._leases.get(lease.stream) != lease:
            raise ValueError(f'KV pool: {lease} is not held')
        del self._leases[lease.stream]
        for page in range(lease.first_page, lease.first_page + lease.num_pages):
            self._owners.free(page)

    def owner(self, page: int) -> int:
        """Id of the stream holding ``page`` (-1: free)."""
        return self._owners.owner(page)

    def _find_extent(self, num_pages: int) -> int:
        run = 0
        for page in range(self.num_pages):
            run = run + 1 if self._owners.is_free(page) else 0
            if run == num_pages:
                return page - num_pages + 1
        return -1
