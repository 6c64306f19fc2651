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
"""The fast path's mode: one value for what is asked and what is in effect, one owner of it.

:class:`FastPathMode` is a frozen value: the mode asked for (``stream.fast_path``, compile),
the aggregator's upper bound after step-downs, compile in effect, the heads whose step runs as
built, whether the bound pool's backend can run whole frames, and why what runs is below what
was asked. :class:`FastPathState` holds the current value (replaced, never mutated, on every
change) and the fallback counters. The engine builds one per model and hands it to its
``Runner``, which reads the mode and reports every step-down here; the session's stats
read it back. Nothing else holds a mode flag (vLLM's ``CudagraphDispatcher`` keeps its mode
in one place the same way).

Step-downs (:data:`~lingbot_map_ros.engine.stats.FALLBACK_KINDS`), each counted by name and
logged once per kind:

* ``compile``: ``torch.compile`` of the segments failed: they run uncompiled;
* ``capture``: a segment's CUDA graph capture was refused: jobs run eagerly;
* ``whole_frame``: a whole-batch CUDA graph could not be captured: batches run segment by
  segment (a batch of one included);
* ``backend_refused``: the backend declares whole-frame support but supplies no capturable
  attention for this pool: segments;
* ``camera_head``, ``depth_head``: that head's step could not be built: it runs eagerly;
* ``attention_kernel``: the attention backend stepped down to a slower kernel of its own
  (``sdpa``: the cuDNN/flash split gave way to plain SDPA); the backend counts these itself.

A backend whose ``graph_support`` is 'segments' (``flashinfer``, ``reference``) caps a
'whole_frame' request at 'segments' from the start: a configuration, not a step-down, so it is
not counted; :attr:`FastPathMode.reason` says so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
import logging
from typing import Any

from ..stats import FALLBACK_KINDS
from ...config import FastPath

logger = logging.getLogger(__name__)

HEADS = ('camera head', 'depth head', 'dino trunk')
"""The parts with a one-frame step of their own (the heads, and the DINO trunk a rollover's
preparation runs frame by frame); the fallback kind of each is its name with '_'."""

_STEP_DOWN: dict[str, str] = {
    'compile': 'torch.compile of the frame segments failed; running them uncompiled',
    'capture': 'CUDA graphs unavailable; running frames eagerly',
    'whole_frame': 'whole-batch CUDA graph unavailable; running frames segment by segment',
    'backend_refused': 'the attention backend supplies no capturable form; running frames '
                       'segment by segment',
    'camera_head': 'camera head fast path unavailable; running it eagerly',
    'depth_head': 'depth head fast path unavailable; running it eagerly',
    'dino_trunk': "a rollover preparation's one-frame DINO step unavailable; running it eagerly",
}
"""What each step-down turns to (the counted kinds the runner reports)."""


@dataclass(frozen=True)
class FastPathMode:
    """What is asked for and what is in effect, as one value."""

    requested: FastPath = 'eager'
    """The mode asked for: the upper bound."""
    compile_requested: bool = False
    """``torch.compile`` asked for."""
    upper: FastPath = 'eager'
    """The aggregator's bound now: the request, lowered by step-downs."""
    segments_compile: bool = False
    """Compile the fixed-shape work of the aggregator's segments (off after a failure)."""
    heads: frozenset[str] = frozenset()
    """Heads whose one-frame step runs as built (captured, compiled); the others run eagerly."""
    heads_compile: bool = False
    """Compile the heads' steps (a failed aggregator compilation leaves it on)."""
    stageable: bool = False
    """The bound pool can run whole frames (False until a pool is bound)."""
    capped_by: str = ''
    """Why the bound pool caps 'whole_frame' at 'segments' ('' when it does not)."""
    last_fallback: str = ''
    """The latest step-down: what runs now and why ('' before any)."""

    @property
    def aggregator(self) -> FastPath:
        """Return the aggregator's mode in effect: 'eager', 'segments' or 'whole_frame'.

        Whole frames need a bound pool that can stage: until then a fast path reads
        'segments'.
        """
        if self.upper == 'whole_frame' and not self.stageable:
            return 'segments'
        return self.upper

    @property
    def compiled(self) -> bool:
        """Whether the aggregator's segments run compiled now."""
        return self.segments_compile and self.aggregator != 'eager'

    @property
    def reason(self) -> str:
        """Why the fast path runs below the request: the latest step-down, or the pool's cap."""
        if self.last_fallback:
            return self.last_fallback
        return self.capped_by if self.aggregator != self.requested else ''

    def head_on(self, part: str) -> bool:
        """Whether part ``part`` (one of :data:`HEADS`) runs its step as built."""
        return part in self.heads

    def step_down(self, kind: str, why: str) -> FastPathMode:
        """Return the mode after a step-down of ``kind`` (``why``: what runs now and why)."""
        if kind == 'compile':
            return replace(self, segments_compile=False, last_fallback=why)
        if kind == 'capture':
            return replace(self, upper='eager', last_fallback=why)
        if kind in ('whole_frame', 'backend_refused'):
            upper: FastPath = 'segments' if self.upper == 'whole_frame' else self.upper
            return replace(self, upper=upper, last_fallback=why)
        part = kind.replace('_', ' ')
        if part in HEADS:
            return replace(self, heads=self.heads - {part}, last_fallback=why)
        raise ValueError(f"fast path step-down '{kind}' is not one of {sorted(_STEP_DOWN)}")


class FastPathState:
    """The one owner of the fast path's mode and of its fallback counters."""

    def __init__(self, mode: FastPath = 'eager', compile: bool = False) -> None:  # noqa: A002
        """Start with ``mode`` and ``compile`` asked for, no pool bound, nothing counted."""
        self._mode = FastPathMode()
        self._counts: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._backend: Any = None
        self._retired = 0
        """Step-downs of backends no longer bound (a replaced pool's stay counted)."""
        self.request(mode, compile)

    @property
    def mode(self) -> FastPathMode:
        """Return the mode now (a frozen value)."""
        return self._mode

    def request(self, mode: FastPath, compile: bool) -> None:  # noqa: A002
        """Ask for ``mode`` and ``compile``: the bound pool and later step-downs lower it.

        Raises:
            ValueError: an unknown mode.
        """
        if mode not in ('eager', 'segments', 'whole_frame'):
            raise ValueError(f"fast path mode '{mode}' is not 'eager', 'segments' or "
                             "'whole_frame'")
        heads = frozenset() if mode == 'eager' else frozenset(HEADS)
        self._mode = replace(self._mode, requested=mode, compile_requested=compile, upper=mode,
                             segments_compile=compile, heads=heads, heads_compile=compile,
                             last_fallback='')

    def restore(self, mode: FastPathMode) -> None:
        """Put back a mode read earlier (a tool that runs eagerly for a while)."""
        self._mode = replace(mode, stageable=self._mode.stageable,
                             capped_by=self._mode.capped_by)

    def bind(self, backend: Any, stageable: bool, capped_by: str = '') -> None:
        """Plan for a pool whose attention ``backend`` can (``stageable``) run whole frames.

        ``backend`` is None when no pool is bound. Its own kernel step-downs
        (``backend.fallbacks``) are counted as ``attention_kernel``, a replaced one's included.
        """
        if backend is not self._backend and self._backend is not None:
            self._retired += self._backend.fallbacks
        self._backend = backend
        self._mode = replace(self._mode, stageable=stageable,
                             capped_by='' if stageable else capped_by)

    def fall_back(self, kind: str, exc: BaseException) -> None:
        """Step down for ``kind``: count it, log the first of its kind, lower the mode.

        Raises:
            ValueError: an unknown kind.
        """
        what = _STEP_DOWN.get(kind)
        if what is None:
            raise ValueError(f"fast path step-down '{kind}' is not one of {sorted(_STEP_DOWN)}")
        why = f'{what} ({type(exc).__name__}: {exc})'
        self._counts[kind] += 1
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning('%s', why)
        self._mode = self._mode.step_down(kind, why)

    def fallbacks(self) -> dict[str, int]:
        """Return the step-downs since start by kind, every kind of ``FALLBACK_KINDS`` listed."""
        live = 0 if self._backend is None else self._backend.fallbacks
        counts = {kind: self._counts.get(kind, 0) for kind in FALLBACK_KINDS}
        counts['attention_kernel'] = self._retired + live
        return counts
