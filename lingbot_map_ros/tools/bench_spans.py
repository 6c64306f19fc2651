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
"""The benchmarks' step profilers: what they do with the engine's step ranges.

A benchmark sets one on the engine (``Engine.set_profiler``; the ranges and their names:
``engine/profiling.py``) instead of patching engine methods:

* :class:`RecordFunctionSpans`: every range a ``torch.profiler`` label (``bench_timeline.py``);
* :class:`PartEvents`: CUDA events around the model's parts, the aggregator and the heads
  (``bench model --components``);
* :class:`LaunchClock`: the host time before a frame's first graph launch and inside launches
  (``bench model --host-timing``).

A range a profiler does not use gets a shared no-op context, so the frame pays nothing more.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import time
from typing import Any

import torch

_NO_SPAN = contextlib.nullcontext()


class RecordFunctionSpans:
    """Every range as a ``torch.profiler.record_function`` label of the same name."""

    def span(self, name: str) -> Any:
        """Return ``record_function(name)``: the span shows in the profiler's trace."""
        return torch.profiler.record_function(name)


class PartEvents:
    """CUDA events around each run of the model's parts (the runner's ranges).

    Args:
        parts: the parts to time, of 'aggregator', 'camera head', 'depth head'.
    """

    def __init__(self, parts: list[str]) -> None:
        self.events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {
            part: [] for part in parts}
        """Per part, (start, end) of each run, recorded on the current stream."""

    def span(self, name: str) -> Any:
        """Bracket ``name`` with two events if it is a part being timed."""
        return self._bracket(name) if name in self.events else _NO_SPAN

    @contextlib.contextmanager
    def _bracket(self, part: str) -> Iterator[None]:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self.events[part].append((start, end))

    def mean_ms(self) -> dict[str, float]:
        """Return each part's mean device ms per run (call after a device sync)."""
        return {part: round(float(sum(a.elapsed_time(b) for a, b in pairs) / len(pairs)), 3)
                for part, pairs in self.events.items() if pairs}


class LaunchClock:
    """Host seconds before each frame's first CUDA graph launch and inside every launch.

    Why: the GPU idles from the end of one frame (the session syncs to read the pose) until the
    first kernel of the next, so host work before the first launch, and a launch's own host
    cost, add to the frame time one for one. Call :meth:`start_frame` before each frame.
    """

    def __init__(self) -> None:
        self.before_first_launch_s = 0.0
        self.in_launches_s = 0.0
        self._frame_start = 0.0
        self._launched = False

    def start_frame(self) -> None:
        """Mark the start of a frame: its first launch adds to ``before_first_launch_s``."""
        self._frame_start = time.perf_counter()
        self._launched = False

    def span(self, name: str) -> Any:
        """Time the range if it is a graph launch."""
        return self._launch() if name == 'graph launch' else _NO_SPAN

    @contextlib.contextmanager
    def _launch(self) -> Iterator[None]:
        begin = time.perf_counter()
        if not self._launched:
            self.before_first_launch_s += begin - self._frame_start
            self._launched = True
        try:
            yield
        finally:
            self.in_launches_s += time.perf_counter() - begin
