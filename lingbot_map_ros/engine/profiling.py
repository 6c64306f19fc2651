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
"""Step ranges: the engine's host steps, named, for a profiler that a benchmark sets.

The engine marks its own step boundaries with ``with step_range(NAME):`` (the names:
:data:`STEPS`). Nothing is recorded unless a profiler is set on the engine
(``Engine.set_profiler``); the engine then makes it the active one for the duration of each of
its calls (:func:`activated`), and every range inside enters ``profiler.span(NAME)``. Without
one a range is a context-variable read and a shared no-op context: nothing measurable.

Why a context variable rather than a reference in every object: the boundaries sit in objects
built long before a benchmark sets its profiler (graphs, staged frames, captured steps) and
shared by every stream; the engine activates its profiler only around its own calls, so another
engine in the process, or code outside the engine, records nothing. Benchmarks
(``tools/bench_timeline.py``, ``tools/bench_model.py``) reach the engine only this way.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Protocol

STEPS: dict[str, str] = {
    'forward eager': "a job alone on the model's eager forward (a scale pass, or mode 'eager')",
    'forward batch': 'streaming frames of one or more streams through the model, as one batch',
    'prepare': "a job's checks against its stream's limits (Aggregator.prepare)",
    'aggregator': "a batch's aggregator on the fast path (segments or a whole-batch graph)",
    'stage': "a frame's cache work written to the device before a whole-frame graph",
    'unstage': 'the staged frame finished (or rolled back) after its graph',
    'batch inputs': "a batch's inputs (patch tokens, RoPE tables) before its graph",
    'batch graph': "a batch's whole graph (every stream's cache attention inside)",
    'lanes': "a batch's per-stream heads run side by side on side streams",
    'camera head': "a frame's camera head (its captured step or eager)",
    'depth head': "a frame's depth head (its captured step or eager)",
    'graph launch': 'the host side of one CUDA graph replay',
    'wait (sync)': 'the host waits for the device (a batch read back)',
}
"""Every range name the engine opens, with what it covers. Ranges nest (a graph launch inside
a batch graph inside an aggregator inside a forward batch)."""


class StepProfiler(Protocol):
    """What the engine needs of a profiler: a context (a span) per named range."""

    def span(self, name: str) -> AbstractContextManager[object]:
        """Return a context that covers the step ``name`` (one of :data:`STEPS`)."""


_NO_RANGE = contextlib.nullcontext()
_ACTIVE: ContextVar[StepProfiler | None] = ContextVar('lingbot_map_step_profiler', default=None)


def step_range(name: str) -> AbstractContextManager[object]:
    """Return the active profiler's range ``name``, or a shared no-op context without one."""
    profiler = _ACTIVE.get()
    return _NO_RANGE if profiler is None else profiler.span(name)


@contextlib.contextmanager
def _activated(profiler: StepProfiler) -> Iterator[None]:
    token = _ACTIVE.set(profiler)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def activated(profiler: StepProfiler | None) -> AbstractContextManager[object]:
    """Return a context in which ``profiler`` records the engine's ranges (None: a no-op)."""
    return _NO_RANGE if profiler is None else _activated(profiler)
