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
"""CUDA-graph capture of fixed-shape work, and a replayable call built on it.

Why: at streaming batch size 1 the model's parts are launch-bound when issued op by op from
Python: the host takes longer to launch the kernels than the GPU to run them
(docs/performance.md, 'CUDA graphs'). Work whose shapes are fixed for a resolution can be
captured once and replayed with one launch. ``capture_graph`` is the shared
warm-up + capture step (the aggregator's segments use it too); ``CapturedCall`` wraps a whole
function of tensors with static input buffers (a head's one-frame step, a batch's segment).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import gc
from typing import Any

import torch

from ..profiling import step_range


def capture_graph(fn: Callable[[], Any],
                  pool: Any = None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Run ``fn`` once on a side stream (warm-up), then capture it.

    The warm-up creates library handles, autotunes and compiles (``torch.compile``), none of
    which may happen during capture.

    Args:
        fn: the work; reads and writes only tensors that outlive the graph.
        pool: memory pool shared with other graphs of the same runner, or None.

    Returns:
        ``(graph, outputs)``: ``graph.replay()`` refills the captured ``outputs`` in place.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # No garbage collection during the capture: a graph it frees (one left in a reference
    # cycle) is destroyed by a CUDA call that a capture forbids, which invalidates this
    # capture. torch.cuda.graph collects once before it begins.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            outputs = fn()
    finally:
        if collecting:
            gc.enable()
    return graph, outputs


def maybe_compile(fn: Callable, enabled: bool) -> Callable:
    """``torch.compile`` for one fixed-shape graph without breaks, or ``fn`` itself.

    fullgraph: a graph break would silently leave unfused kernels behind; fail instead and let
    the caller fall back to the plain function.
    """
    return torch.compile(fn, dynamic=False, fullgraph=True) if enabled else fn


class CapturedCall:
    """``fn(*tensors) -> tuple of tensors`` with fixed shapes, replayed as one CUDA graph.

    Inputs are copied into static buffers before each replay; outputs are cloned, since the
    next replay overwrites them. Without ``capture`` it just calls ``fn`` (compiled or not).
    An input listed in ``constant`` is copied only when a different tensor object comes in:
    for tensors a cache hands out again unchanged (a batch's special tokens, RoPE tables).
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]],
                 example_inputs: Sequence[torch.Tensor], capture: bool,
                 compile_fn: bool = False, pool: Any = None,
                 constant: Sequence[int] = ()) -> None:
        """Compile (optionally) and capture ``fn`` for inputs shaped like ``example_inputs``.

        Args:
            fn: pure function of the tensors (module parameters may be read).
            example_inputs: tensors of the shapes, dtypes and device of every later call.
            capture: capture a CUDA graph (CUDA only); False runs ``fn`` directly.
            compile_fn: ``torch.compile`` ``fn`` first.
            pool: memory pool shared with other graphs (``capture_graph``), or None.
            constant: positions of inputs never changed in place between calls.
        """
        self._fn = maybe_compile(fn, compile_fn)
        self._static = [t.detach().clone() for t in example_inputs]
        self._fed: list[Any] = [t if i in constant else None
                                for i, t in enumerate(example_inputs)]
        """The constant inputs last copied in (by identity); None for the others."""
        self._graph: torch.cuda.CUDAGraph | None = None
        self._outputs: tuple[torch.Tensor, ...] = ()
        if capture:
            self._graph, self._outputs = capture_graph(lambda: self._fn(*self._static), pool)
        elif compile_fn:
            self._fn(*self._static)  # compile now, where the caller can still fall back

    def __call__(self, *inputs: torch.Tensor | int | float) -> tuple[torch.Tensor, ...]:
        """Run on ``inputs`` (same shapes as the examples); returns fresh output tensors.

        A Python number stands for a 0-d input: it fills the static buffer with one kernel
        (no host-to-device copy).
        """
        if self._graph is None:
            # No graph to feed: tensors go straight in (no copies); numbers still need a tensor.
            return self._fn(*(value if isinstance(value, torch.Tensor) else static.fill_(value)
                              for static, value in zip(self._static, inputs)))
        for i, (static, value) in enumerate(zip(self._static, inputs)):
            fed = self._fed[i]
            if fed is not None and value is fed:
                continue
            if isinstance(value, torch.Tensor):
                static.copy_(value)
                if fed is not None:
                    self._fed[i] = value
            else:
                static.fill_(value)
        with step_range('graph launch'):
            self._graph.replay()
        return tuple(out.clone() for out in self._outputs)
