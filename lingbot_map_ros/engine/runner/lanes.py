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
"""Lanes: a batch's independent per-stream work side by side on side CUDA streams.

Why: in a batch of B streams, what reads one stream's state runs per stream: each global
block's cache attention (a kernel whose last wave leaves SMs idle) and each stream's camera head
(a captured step of small, latency-bound kernels). Issued on one stream they run one after the
other although nothing ties them; on side streams the GPU runs them together, each filling
the other's idle SMs (docs/performance.md, 'Batches of cameras'). The kernels are the same and
each lane's work stays in its order, so the results are the same too.

How: :meth:`Lanes.run` forks every side stream from the current stream (each waits on it),
issues work b on side stream b, then makes the current stream wait on every side stream. Inside
a CUDA graph capture this fork/join is what records parallel branches; the join must come
before the capture ends, so it is in a ``finally``.

Memory (PyTorch's caching allocator keys a freed block to the stream it was allocated on):

* what the current stream made and a lane reads must stay referenced until the join (the
  caller holds it: the lanes' inputs are its arguments);
* a lane's result is made on its side stream and read after the join; outside a capture it is
  also recorded on the current stream (``record_stream``);
* the side streams only ever work after a fork, so a block a lane reuses was last read before
  that fork;
* work the current stream does during the lanes (``current``) is issued before the side work:
  a block a lane frees on the host cannot then go to it while the lane still reads it.

``Lanes(overlap=False)`` (``cache.kernel.lanes`` false) turns the lanes off: the same work,
issued in the same order on the current stream; a captured graph keeps the form it was
captured in. Without CUDA there is nothing to overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar('T')


class Lanes:
    """Side CUDA streams, made on first use and kept (one set per batch graphs).

    Args:
        overlap: run the work on side streams (``cache.kernel.lanes``); False: one after the
            other on the current stream.
    """

    def __init__(self, overlap: bool = True) -> None:
        self.overlap = overlap
        self._streams: list[Any] = []
        self.forks = 0
        """Times work ran on side streams (diagnostics and tests)."""

    def run(self, device: torch.device, work: Sequence[Callable[[], T]],
            current: Callable[[], Any] | None = None) -> list[T]:
        """Run ``work`` (one callable per stream), each on its own side stream where it can.

        Args:
            device: where the work runs; lanes only on CUDA with ``overlap`` on.
            work: independent callables; each one's own kernels stay in order.
            current: work for the current stream, issued first (before the side work), which
                the lanes overlap too.

        Returns:
            The results of ``work``, in its order.
        """
        if not self.overlap or device.type != 'cuda' or len(work) + (current is not None) < 2:
            if current is not None:
                current()
            return [fn() for fn in work]
        main = torch.cuda.current_stream(device)
        sides = self._sides(device, len(work))
        outs: list[T] = []
        for side in sides:
            side.wait_stream(main)
        try:
            if current is not None:
                current()
            for side, fn in zip(sides, work):
                with torch.cuda.stream(side):
                    outs.append(fn())
        finally:
            for side in sides:
                main.wait_stream(side)
        if not torch.cuda.is_current_stream_capturing():
            for out in outs:
                _record(out, main)
        self.forks += 1
        return outs

    def _sides(self, device: torch.device, count: int) -> list[Any]:
        streams = [s for s in self._streams if s.device == device]
        while len(streams) < count:
            stream = torch.cuda.Stream(device)
            self._streams.append(stream)
            streams.append(stream)
        return streams[:count]


def _record(out: Any, stream: Any) -> None:
    """Mark the tensors of a lane's result as used on ``stream`` (their blocks wait for it)."""
    if isinstance(out, torch.Tensor):
        out.record_stream(stream)
    elif isinstance(out, (tuple, list)):
        for item in out:
            _record(item, stream)
    elif isinstance(out, dict):
        for item in out.values():
            _record(item, stream)
