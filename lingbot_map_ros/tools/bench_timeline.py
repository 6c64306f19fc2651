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
"""Where a tick's time goes: host ranges, the GPU's busy and idle time, kernels by kind.

``lingbot_map_bench model --cameras N --profile T`` runs T more ticks under ``torch.profiler``
(host and CUDA activity) with the host steps labelled, then reads the trace back and reports,
per tick (mean over the ticks):

* wall time, the GPU's busy time (the union of its kernels, copies and fills) and idle time,
  and how much of the idle time falls before the first kernel and after the last;
* the GPU's idle time by the host step running meanwhile (innermost label): what the GPU
  waits for;
* device time by kernel kind (summed: kernels on side streams overlap, so the sum can exceed
  the busy time) and by the host step that launched the kernel, the innermost one open at its
  launch (a replayed graph's kernels go to its 'graph launch'; the labels around it say whose
  graph it is: 'batch graph' for a whole batch, 'aggregator' for segments, 'camera head' or
  'depth head' for a head's step).

The labels are the engine's own step ranges (``engine/profiling.py``, ``STEPS``: staging, the
graph replays, the heads, the waits), recorded through the profiler the engine is given
(:class:`RecordFunctionSpans`, ``Engine.set_profiler``), and the benchmark's session steps
around them (:data:`SESSION_STEPS`: planning, finishing). Nothing is patched.

Why: a batch of several cameras' frames shares the frame-wise work but also the host work and
the waits around it; a kernel table alone does not show which of them a tick's time is in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
import json
import os
import tempfile
from typing import Any

from lingbot_map_ros.engine.engine import Engine
import torch

TICK = 'tick'
SESSION_STEPS = {'plan': "a session plans its frame's model call (``frame_job``)",
                 'finish': "a session takes its frame's outcome (``finish_job``)"}
"""The benchmark's own labels around the sessions' calls (``bench_cameras.step_batch``)."""
KINDS: list[tuple[str, tuple[str, ...]]] = [
    # (kind, name fragments), first match wins
    # PyTorch's own flash kernels (frame, DINO and camera-head attention) before FA3's,
    # whose names hold 'flash::' too.
    ('frame attention', ('pytorch_flash', 'fmha', 'cudnn')),
    ('cache attention (FA3)', ('FlashAttnFwdSm90', 'flash::', 'fa3')),
    ('cache attention (Triton)', ('_attend_part', '_attend_run', '_attn_fwd')),
    ('parts prepare/merge', ('_prepare', '_merge')),
    ('GEMM', ('nvjet', 'gemm', 'cutlass', 'sm90_xmma')),
    ('compiled elementwise/norms', ('triton_',)),
    ('index/copy/fill', ('index', 'copy', 'Memcpy', 'Memset', 'fill', 'cat')),
    ('other', ('',)),
]


class RecordFunctionSpans:
    """A step profiler (``engine/profiling.py``): each span a ``torch.profiler`` label."""

    def span(self, name: str) -> Any:
        """Return ``record_function(name)``: the span shows in the profiler's trace."""
        return torch.profiler.record_function(name)


def _profiled(run: Callable[[], object], device: torch.device,
              rows: int = 30) -> tuple[Any, str]:
    """Run ``run()`` under ``torch.profiler`` (CUDA activity too on CUDA).

    Returns:
        The profiler, and its top ``rows`` operators by device time (by host time without
        CUDA) as a table.
    """
    from torch.profiler import profile, ProfilerActivity

    cuda = device.type == 'cuda'
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run()
    table = prof.key_averages().table(sort_by='cuda_time_total' if cuda else 'cpu_time_total',
                                      row_limit=rows, max_name_column_width=60)
    return prof, table


def print_profile(run: Callable[[], object], device: torch.device) -> None:
    """Print where the time of ``run()`` (more frames) goes, operator by operator."""
    print(_profiled(run, device)[1])


def profile_ticks(run: Callable[[RecordFunctionSpans], Any], engine: Engine,
                  device: torch.device, rows: int = 30) -> tuple[dict[str, Any], str]:
    """Profile ``run(spans)``, which wraps each tick in ``spans.span(TICK)``.

    ``engine`` records its step ranges into the same spans meanwhile (its profiler is put
    back after); ``run`` labels its own steps with them too (:data:`SESSION_STEPS`).
    Without CUDA the trace has no device work: the whole tick counts as idle, which then
    splits the host's time by step.

    Returns:
        :func:`summarise`'s dict, and the operator table of :func:`_profiled`.
    """
    spans = RecordFunctionSpans()
    before = engine.profiler
    engine.set_profiler(spans)
    try:
        prof, table = _profiled(lambda: run(spans), device, rows)
    finally:
        engine.set_profiler(before)
    handle, path = tempfile.mkstemp(suffix='.json')
    os.close(handle)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)['traceEvents']
    finally:
        os.unlink(path)
    return summarise(events), table


def _kind(name: str) -> str:
    for kind, fragments in KINDS:
        if any(fragment in name for fragment in fragments):
            return kind
    return 'other'


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _innermost(labels: list[tuple[float, float, str]], t: float) -> str:
    """Return the shortest label covering time ``t`` ('-' outside every label)."""
    best, span = '-', float('inf')
    for lo, hi, name in labels:
        if lo <= t < hi and hi - lo < span:
            best, span = name, hi - lo
    return best


def summarise(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Reduce a Chrome trace of labelled ticks to per-tick means (ms); see the module docstring.

    Returns:
        ``ticks``, ``wall_ms``, ``busy_ms``, ``idle_ms``, ``idle_before_first_ms``,
        ``idle_after_last_ms``, ``idle_by_step_ms``, ``kernel_ms_by_kind``,
        ``kernel_ms_by_step``, ``kernels`` (count); all per tick.
    """
    spans = [e for e in events if e.get('ph') == 'X' and 'dur' in e]
    ticks = sorted((e['ts'], e['ts'] + e['dur']) for e in spans
                   if e.get('cat') == 'user_annotation' and e['name'] == TICK)
    labels = [(e['ts'], e['ts'] + e['dur'], e['name']) for e in spans
              if e.get('cat') == 'user_annotation' and e['name'] != TICK]
    device = [e for e in spans if e.get('cat') in ('kernel', 'gpu_memcpy', 'gpu_memset')]
    launches = {e['args']['correlation']: e['ts'] for e in spans
                if e.get('cat') in ('cuda_runtime', 'cuda_driver')
                and 'correlation' in e.get('args', {})}
    totals: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    by_step: dict[str, float] = defaultdict(float)
    idle_by: dict[str, float] = defaultdict(float)
    for t0, t1 in ticks:
        inside = [e for e in device if e['ts'] < t1 and e['ts'] + e['dur'] > t0]
        tick_labels = [lab for lab in labels if lab[0] < t1 and lab[1] > t0]
        busy = _union([(max(e['ts'], t0), min(e['ts'] + e['dur'], t1)) for e in inside])
        busy_us = sum(hi - lo for lo, hi in busy)
        totals['wall'] += t1 - t0
        totals['busy'] += busy_us
        totals['kernels'] += len(inside)
        if busy:
            totals['before'] += busy[0][0] - t0
            totals['after'] += t1 - busy[-1][1]
        gaps = [(a, b) for (_, a), (b, _) in zip([(t0, t0)] + busy, busy + [(t1, t1)]) if b > a]
        for lo, hi in gaps:
            # Split each gap at the label boundaries inside it; charge each piece.
            cuts = sorted({lo, hi, *(x for lab in tick_labels for x in lab[:2] if lo < x < hi)})
            for a, b in zip(cuts, cuts[1:]):
                idle_by[_innermost(tick_labels, (a + b) / 2)] += b - a
        for e in inside:
            by_kind[_kind(e['name'])] += e['dur']
            when = launches.get(e.get('args', {}).get('correlation'))
            by_step[_innermost(tick_labels, when) if when is not None else '-'] += e['dur']
    count = max(len(ticks), 1)

    def per_tick(values: dict[str, float]) -> dict[str, float]:
        return {k: round(v / count / 1e3, 3)
                for k, v in sorted(values.items(), key=lambda kv: -kv[1])}
    return {'ticks': len(ticks), 'wall_ms': round(totals['wall'] / count / 1e3, 3),
            'busy_ms': round(totals['busy'] / count / 1e3, 3),
            'idle_ms': round((totals['wall'] - totals['busy']) / count / 1e3, 3),
            'idle_before_first_ms': round(totals['before'] / count / 1e3, 3),
            'idle_after_last_ms': round(totals['after'] / count / 1e3, 3),
            'idle_by_step_ms': per_tick(idle_by), 'kernel_ms_by_kind': per_tick(by_kind),
            'kernel_ms_by_step': per_tick(by_step),
            'kernels': round(totals['kernels'] / count, 1)}


def print_timeline(summary: dict[str, Any]) -> None:
    """Print :func:`summarise`'s result as a short table, then as one JSON line."""
    print(f"timeline over {summary['ticks']} ticks (ms per tick): wall {summary['wall_ms']}, "
          f"GPU busy {summary['busy_ms']}, idle {summary['idle_ms']} (before the first "
          f"kernel {summary['idle_before_first_ms']}, after the last "
          f"{summary['idle_after_last_ms']}), {summary['kernels']} kernels")
    for title, key in (('GPU idle while the host is in', 'idle_by_step_ms'),
                       ('device time by kernel kind', 'kernel_ms_by_kind'),
                       ('device time by the host step that launched it', 'kernel_ms_by_step')):
        print(f'  {title}:')
        for name, ms in summary[key].items():
            print(f'    {name:<34} {ms:8.3f}')
    print(json.dumps({'timeline': summary}, sort_keys=True))
