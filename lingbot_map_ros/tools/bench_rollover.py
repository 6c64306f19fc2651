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
"""Long-run numbers of ``lingbot_map_bench model``: per-block means, memory, rollover cost.

Why a flatness number needs care: after every rollover (and at the start) the new session's
sliding window is empty and refills over the next W keyframes, and those frames attend to
fewer cached tokens, so they are faster (the cache attention is over half of a full-window
frame: docs/performance.md, 'Floors per part of a frame'). A block of frames that holds a
window refill therefore has a lower mean than one that does not. Before a rollover the next
session is prepared: for ``lead`` frames each frame also runs one unit of its scale pass
(``engine/scale_pass.py``), so those frames are a little slower, and the rollover frame
itself only switches. :func:`block_report` gives the max/min ratio of the block means over every
block after the first (nothing excluded) and, separately, over the blocks that hold no refill, no
preparation and no rollover frame, so each effect is visible rather than averaged away; the
preparation frames and the rollover frames are reported against the median frame on their own.

What a live node loses to those frames: :func:`live_drops` replays the measured frame times
through the node's live frame queue at a camera rate, once as measured and once with the
preparation and rollover frames at the median (the same stream without rollovers).
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

from lingbot_map_ros.ros.inference.worker import FrameQueue, LIVE_CAPACITY
import numpy as np


HEADLINE_KEYS: tuple[str, ...] = (
    'rollover_over_median', 'max_streaming_over_median', 'flatness_steady',
    'prepare_over_median', 'prepare_ms_mean', 'peak_gib_with_rollover',
    'peak_gib_without_rollover', 'live_drops_with_rollovers', 'live_drops_without_rollovers',
    'live_hz')
"""Keys of the report that ``bench model`` also puts at its JSON's top level (issue #24)."""


def block_report(times_ms: list[float], rollover_at: list[int], window: int,
                 block: int = 100, peaks_gib: list[float] | None = None,
                 prepare_at: list[int] | None = None) -> dict[str, Any]:
    """Summarise a long timed run block by block.

    Args:
        times_ms: per-call ms of the timed run (call 0 = the scale phase).
        rollover_at: indices into ``times_ms`` of the calls that rolled over.
        window: sliding window W (keyframes): calls ``[r, r + W)`` after a rollover refill it.
        block: calls per block.
        peaks_gib: peak GPU memory of each block (may be empty on the CPU).
        prepare_at: indices of the calls that also ran a unit of the next session's scale
            pass.

    Returns:
        ``block_ms`` (mean per block), ``flatness_all`` (max/min over blocks 1..),
        ``flatness_steady`` (the same over blocks with no refill, no preparation and no
        rollover, None when there are fewer than 2), the rollover calls' ms against the median
        call (``rollover_ms_mean``, ``rollover_ms_max``, ``rollover_over_median``), the
        preparing calls' (``prepare_frames``, ``prepare_ms_mean``, ``prepare_ms_max``,
        ``prepare_over_median``), the slowest streaming call after the first block
        (``max_streaming_over_median``, rollovers included), and ``peak_gib_per_block`` with
        ``peak_flatness`` when peaks are given, plus the peak of the blocks that hold a
        preparation or a rollover and of those that do not (``peak_gib_with_rollover``,
        ``peak_gib_without_rollover``); ``slowest``: the (up to) 5 slowest calls after the first
        block, slowest first, each ``{'index', 'ms', 'kind'}`` with kind ``'rollover'``,
        ``'prepare'`` or ``'frame'``, so a long run shows where its maximum comes from.
    """
    times = np.asarray(times_ms, dtype=np.float64)
    num_blocks = len(times) // block
    means = [float(times[b * block:(b + 1) * block].mean()) for b in range(num_blocks)]
    prepare_at = prepare_at or []
    refill = np.zeros(len(times), bool)
    refill[:window + 1] = True  # the first session fills its window too
    for r in rollover_at:
        refill[r:r + window + 1] = True
    rolling = np.zeros(len(times), bool)  # preparing or switching
    rolling[prepare_at] = True
    rolling[rollover_at] = True
    steady = [m for b, m in enumerate(means[1:], start=1)
              if not (refill | rolling)[b * block:(b + 1) * block].any()]
    normal = np.delete(times[1:], [r - 1 for r in rollover_at if r >= 1])
    median = float(np.median(normal)) if len(normal) else float('nan')
    rolls = times[rollover_at] if rollover_at else np.zeros(0)
    preps = times[prepare_at] if prepare_at else np.zeros(0)
    after_first = times[block:] if len(times) > block else times[1:]
    report: dict[str, Any] = {
        'block': block,
        'block_ms': [round(m, 3) for m in means],
        'flatness_all': _ratio(means[1:]),
        'flatness_steady': _ratio(steady) if len(steady) >= 2 else None,
        'steady_blocks': len(steady),
        'rollovers': len(rollover_at),
        'median_ms': round(median, 3),
        'rollover_ms_mean': round(float(rolls.mean()), 3) if len(rolls) else None,
        'rollover_ms_max': round(float(rolls.max()), 3) if len(rolls) else None,
        'rollover_over_median': round(float(rolls.max()) / median, 3) if len(rolls) else None,
        'prepare_frames': len(prepare_at),
        'prepare_ms_mean': round(float(preps.mean()), 3) if len(preps) else None,
        'prepare_ms_max': round(float(preps.max()), 3) if len(preps) else None,
        'prepare_over_median': round(float(preps.max()) / median, 3) if len(preps) else None,
        'max_streaming_over_median': round(float(after_first.max()) / median, 3)
        if len(after_first) else None,
        'slowest': _slowest(times, block if len(times) > block else 1, rollover_at, prepare_at),
    }
    if peaks_gib:
        report['peak_gib_per_block'] = [round(p, 3) for p in peaks_gib]
        report['peak_flatness'] = _ratio(peaks_gib[1:]) if len(peaks_gib) > 1 else None
        held = [rolling[b * block:(b + 1) * block].any() for b in range(len(peaks_gib))]
        with_roll = [p for p, h in zip(peaks_gib[1:], held[1:]) if h]
        without = [p for p, h in zip(peaks_gib[1:], held[1:]) if not h]
        report['peak_gib_with_rollover'] = round(max(with_roll), 3) if with_roll else None
        report['peak_gib_without_rollover'] = round(max(without), 3) if without else None
    return report


def _slowest(times: np.ndarray, first: int, rollover_at: list[int], prepare_at: list[int],
             num: int = 5) -> list[dict[str, Any]]:
    order = first + np.argsort(-times[first:], kind='stable')[:num]
    rollovers, prepares = set(rollover_at), set(prepare_at)
    return [{'index': int(i), 'ms': round(float(times[i]), 3),
             'kind': 'rollover' if i in rollovers else 'prepare' if i in prepares else 'frame'}
            for i in order]


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--live-hz`` and ``--live-queue`` (:func:`live_drop_report`) to ``parser``."""
    parser.add_argument('--live-hz', type=float, default=30.0,
                        help="camera rate at which the long run's frame times are replayed "
                             'through the live queue (live_drops_*)')
    parser.add_argument('--live-queue', type=int, default=LIVE_CAPACITY,
                        help="frames the replayed live queue holds (default: the node's)")


def live_drops(times_ms: list[float], hz: float, capacity: int) -> int:
    """Replay served-frame times through the node's live queue; return the frames it drops.

    A camera sends a frame every ``1 / hz`` s from time 0; one worker serves them in order, the
    k-th frame it serves taking ``times_ms[k]`` (a rollover comes after a number of served
    frames, not of sent ones). A frame that arrives while the worker is busy waits in the
    node's live :class:`~lingbot_map_ros.ros.inference.worker.FrameQueue` of ``capacity``;
    when it is full the oldest waiting frame is dropped (``drops.queue_overflow``). The replay
    ends when every time has been served.

    Raises:
        ValueError: ``hz`` not positive or ``capacity`` below 1.
    """
    if hz <= 0:
        raise ValueError(f'live camera rate must be > 0 Hz, got {hz}')
    queue = FrameQueue(capacity, block_when_full=False)
    service = collections.deque(float(t) / 1e3 for t in times_ms)
    period, drops, arrival, free = 1.0 / hz, 0, 0, 0.0
    while service:
        now = arrival * period
        # The worker takes waiting frames whenever it is free before this arrival.
        while service and free <= now and len(queue):
            waited = queue.get(0.0)
            free = max(free, waited) + service.popleft()
        if not service:
            break
        if free <= now:  # idle: this frame is served at once
            free = now + service.popleft()
        else:
            drops += queue.put(now)
        arrival += 1
    return drops


def live_drop_report(times_ms: list[float], rollover_at: list[int], prepare_at: list[int],
                     hz: float, capacity: int) -> dict[str, Any]:
    """Live drops of the streaming calls (1..) as measured and without rollovers.

    Without rollovers: the same calls with every preparation and rollover call at the median
    of the other streaming calls.
    """
    times = np.asarray(times_ms[1:], dtype=np.float64)
    rolling = np.zeros(len(times), bool)
    rolling[[i - 1 for i in [*rollover_at, *prepare_at] if i >= 1]] = True
    flat = times.copy()
    if rolling.any() and not rolling.all():
        flat[rolling] = np.median(times[~rolling])
    return {'live_drops_with_rollovers': live_drops(list(times), hz, capacity),
            'live_drops_without_rollovers': live_drops(list(flat), hz, capacity),
            'live_hz': hz, 'live_queue': capacity}


def _ratio(values: list[float]) -> float | None:
    return round(max(values) / min(values), 4) if values and min(values) > 0 else None
