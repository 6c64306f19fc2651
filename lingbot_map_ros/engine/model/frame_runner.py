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
"""FrameRunner: how the aggregator's streaming frames run (eager, segments or whole frames).

The aggregator (``aggregator.py``) is a plain module: it checks a call, owns its KV cache and
runs the eager layer loop. This runner sits above it and owns the fast path: which mode is in
effect, the segment runner of each resolution (``graphed.py``) keyed by :class:`CaptureKey`,
and one fallback that logs once and is counted in :meth:`FrameRunner.stats`.

Modes (the mode asked for, then the one in effect after any fallback):

* ``eager``: the aggregator's own ``forward``;
* ``segments``: the fixed-shape work between cache attentions replayed as CUDA graphs (or
  compiled, or both), the cache attention eager in between;
* ``whole_frame``: segments plus the cache's staged attention (``cache/staged_frames.py``), one
  CUDA graph per kind of frame; needs a backend with ``graph_support == 'whole_frame'``.

The scale pass always runs eagerly (its shapes are used once).
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
from typing import Literal

import torch

from .aggregator import Aggregator, AggregatorOutput
from .graphed import FrameGraphs
from ..cache.staged_frames import can_stage, StagedFrames
from ..frames import Role

logger = logging.getLogger(__name__)

FastPathMode = Literal['eager', 'segments', 'whole_frame']


@dataclass(frozen=True)
class CaptureKey:
    """What a built segment runner depends on; a new key builds a new runner."""

    shape: tuple[int, ...]
    device: torch.device
    kv_dtype: torch.dtype
    weight_dtype: torch.dtype
    weights_ptr: int
    """Storage of the aggregator's weights: moving the module re-allocates what graphs read."""
    capture: bool
    compiled: bool
    cache: object | None
    """The cache a whole-frame runner writes into (None for segments)."""


@dataclass(frozen=True)
class FastPathStats:
    """The fast path in effect now, for diagnostics."""

    mode: FastPathMode
    """'eager', 'segments' or 'whole_frame'."""
    cuda_graphs: bool
    """Frames replay CUDA graphs (off after a failed capture)."""
    compiled: bool
    """Frame segments run ``torch.compile``d (off after a failed compilation)."""
    fallbacks: int
    """Times the fast path stepped down (compile -> plain -> eager, whole frame -> segments)."""


class FrameRunner:
    """Runs an aggregator's calls, through the fast path where it is on and works."""

    def __init__(self, aggregator: Aggregator) -> None:
        """Start with the fast path off (``set_fast_path`` turns it on)."""
        self._agg = aggregator
        self.cuda_graphs = False
        """Replay streaming frames' fixed-shape work as CUDA graphs."""
        self.compile_segments = False
        """``torch.compile`` the streaming frames' fixed-shape work."""
        self.stage_frames = True
        """With the fast path, run whole frames where the cache backend can stage them."""
        self._graphs: tuple[CaptureKey, FrameGraphs] | None = None
        self._fallbacks = 0
        self._logged: set[str] = set()

    def set_fast_path(self, cuda_graphs: bool, compile_segments: bool) -> None:
        """Choose CUDA graphs and ``torch.compile`` for the streaming frames."""
        self.cuda_graphs = cuda_graphs
        self.compile_segments = compile_segments

    @property
    def graphs(self) -> FrameGraphs | None:
        """Return the segment runner built for the latest resolution, if any."""
        return None if self._graphs is None else self._graphs[1]

    @property
    def mode(self) -> FastPathMode:
        """Return the mode in effect now; before the first streaming frame, the one expected.

        Whole frames need the cache (its backend's ``graph_support``): until it exists, a
        fast path reads 'segments'.
        """
        if not (self.cuda_graphs or self.compile_segments):
            return 'eager'
        graphs = self.graphs
        if graphs is not None:
            return 'whole_frame' if graphs.staged else 'segments'
        cache = self._agg.kv_cache
        staged = self.stage_frames and cache is not None and can_stage(cache)
        return 'whole_frame' if staged else 'segments'

    def stats(self) -> FastPathStats:
        """Return the fast path in effect now."""
        return FastPathStats(mode=self.mode, cuda_graphs=self.cuda_graphs,
                             compiled=self.compile_segments, fallbacks=self._fallbacks)

    def fall_back(self, what: str, exc: BaseException) -> None:
        """Report a step down of the fast path: logged once per kind, counted every time."""
        self._fallbacks += 1
        if what not in self._logged:
            self._logged.add(what)
            logger.warning('%s (%s: %s)', what, type(exc).__name__, exc)

    def __call__(self, images: torch.Tensor, time_index: int, mode: Role) -> AggregatorOutput:
        """Run one call of the streaming schedule (see ``Aggregator.forward``)."""
        agg = self._agg
        patch_hw = agg.prepare(images, time_index, mode)
        segmented = self.cuda_graphs or self.compile_segments
        graphs = self._graphs_for(images) if mode != 'scale' and segmented else None
        if graphs is None:
            return agg.run(images, time_index, mode, patch_hw)
        agg.mark_cache_used()
        return graphs.run(images, time_index, mode)

    def _graphs_for(self, images: torch.Tensor) -> FrameGraphs | None:
        """Return the segment runner of this resolution, dtype and device (built once).

        Returns None, and turns :attr:`cuda_graphs` off, when the runner cannot be built (e.g.
        a CUDA graph capture this PyTorch/driver refuses): frames then run eagerly, slower but
        right, instead of failing one after another. A failed ``torch.compile`` (no compiler,
        no Triton) turns :attr:`compile_segments` off and builds the uncompiled runner.
        """
        agg = self._agg
        cache = agg.kv_cache
        capture = self.cuda_graphs and images.device.type == 'cuda'
        staged = self.stage_frames and can_stage(cache)
        key = CaptureKey(tuple(images.shape), images.device, agg.kv_dtype,
                         agg.camera_token.dtype, agg.camera_token.data_ptr(), capture,
                         self.compile_segments, cache if staged else None)
        if self._graphs is not None and self._graphs[0] == key:
            return self._graphs[1]
        self._graphs = None  # release the old graphs' memory first
        try:
            staging = StagedFrames(cache, self.compile_segments) if staged else None
            runner = FrameGraphs(agg, images, capture, self.compile_segments, staging,
                                 self.fall_back)
        except Exception as exc:  # noqa: BLE001 - Inductor/Triton raise many kinds
            if not self.compile_segments:
                self.fall_back('CUDA graphs unavailable; running frames eagerly', exc)
                self.cuda_graphs = False
                return None
            self.fall_back('torch.compile of the frame segments failed; running them '
                           'uncompiled', exc)
            self.compile_segments = False
            return self._graphs_for(images)
        self._graphs = (key, runner)
        return runner

    @torch.no_grad()
    def prepare_full_window(self) -> None:
        """Capture the full-window frame graphs now (see ``FrameGraphs.prepare_full_window``).

        Writes placeholders into the cache: reset it before the next stream.
        """
        if self._graphs is not None:
            self._graphs[1].prepare_full_window()
