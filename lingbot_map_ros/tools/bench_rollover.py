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
fewer cached tokens, so they are faster (on the H200 at 504x378 the cache attention is ~16 of
~29 ms of a full-window frame). A block of frames that holds a window refill therefore has a
lower mean than one that does not, and the rollover frame itself is slower (it runs the new
session's scale phase). :func:`block_report` gives the max/min ratio of the block means over
every block after the first (nothing excluded) and, separately, over the blocks that hold no
refill and no rollover frame, so both effects are visible rather than averaged away.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def block_report(times_ms: list[float], rollover_at: list[int], window: int,
                 block: int = 100, peaks_gib: list[float] | None = None) -> dict[str, Any]:
    """Summarise a long timed run block by block.

    Args:
        times_ms: per-call ms of the timed run (call 0 = the scale phase).
        rollover_at: indices into ``times_ms`` of the calls that rolled over.
        window: sliding window W (keyframes): calls ``[r, r + W)`` after a rollover refill it.
        block: calls per block.
        peaks_gib: peak GPU memory of each block (may be empty on the CPU).

    Returns:
        ``block_ms`` (mean per block), ``flatness_all`` (max/min over blocks 1..),
        ``flatness_steady`` (the same over blocks with no refill and no rollover, None when
        there are fewer than 2), the rollover calls' ms against the median call
        (``rollover_ms_mean``, ``rollover_ms_max``, ``rollover_over_median``), and
        ``peak_gib_per_block`` with ``peak_flatness`` when peaks are given.
    """
    times = np.asarray(times_ms, dtype=np.float64)
    num_blocks = len(times) // block
    means = [float(times[b * block:(b + 1) * block].mean()) for b in range(num_blocks)]
    refill = np.zeros(len(times), bool)
    refill[:window + 1] = True  # the first session fills its window too
    for r in rollover_at:
        refill[r:r + window + 1] = True
    steady = [m for b, m in enumerate(means[1:], start=1)
              if not refill[b * block:(b + 1) * block].any()]
    normal = np.delete(times[1:], [r - 1 for r in rollover_at if r >= 1])
    median = float(np.median(normal)) if len(normal) else float('nan')
    rolls = times[rollover_at] if rollover_at else np.zeros(0)
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
    }
    if peaks_gib:
        report['peak_gib_per_block'] = [round(p, 3) for p in peaks_gib]
        report['peak_flatness'] = _ratio(peaks_gib[1:]) if len(peaks_gib) > 1 else None
    return report


def _ratio(values: list[float]) -> float | None:
    return round(max(values) / min(values), 4) if values and min(values) > 0 else None
