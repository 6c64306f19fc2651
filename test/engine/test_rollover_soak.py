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
"""Soak: the tiny model through StreamFeeder + RolloverSession for thousands of frames.

Every frame must give exactly one pose (nothing dropped, nothing twice), no session limit may be
hit, and the process RSS must stay flat once warmed up (the ring buffer, the caches and the
stitching hold no per-frame state that grows). The full run is marked slow; CI runs the short
one. ``LINGBOT_SOAK_CURVE=path`` writes the RSS curve (frame, MiB) as CSV.

Run: ``OMP_NUM_THREADS=1 python -m pytest -m slow test/engine/test_rollover_soak.py -s``
(3,000 frames: a few minutes on 2 cores).
"""

from __future__ import annotations

import os

from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.engine.session.stream_feeder import StreamFeeder
import pytest
from tiny_engine import random_frames, tiny_session
import torch

SEC = 10**9


def _rss_mib() -> float:
    with open('/proc/self/statm', encoding='ascii') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20


def _soak(num: int) -> tuple[list[int], dict, list[tuple[int, float]]]:
    torch.set_num_threads(1)
    session = RolloverSession(tiny_session({
        'stream.image_width': 56, 'cache.scale_frames': 2, 'cache.sliding_window': 4,
        'stream.session_keyframes': 24, 'stream.overlap_keyframes': 4}))
    feeder = StreamFeeder(session)
    pool = random_frames(16, seed=0, size=(42, 56))
    out, curve = [], []
    for i in range(num):
        fed = feeder.feed(pool[i % len(pool)], 10 * SEC + i * SEC // 10)
        assert fed.accepted and fed.resets == () and fed.drop is None, (i, fed)
        out += [p.stamp_ns for p in fed.predictions]
        if (i + 1) % 100 == 0:
            curve.append((i + 1, _rss_mib()))
    out += [p.stamp_ns for p in session.flush()]
    path = os.environ.get('LINGBOT_SOAK_CURVE')
    if path:
        with open(path, 'w', encoding='ascii') as f:
            f.write('frame,rss_mib\n' + ''.join(f'{n},{r:.2f}\n' for n, r in curve))
    return out, session.rollover_stats(), curve


@pytest.mark.parametrize('num', [pytest.param(3000, marks=pytest.mark.slow), 400])
def test_soak_keeps_every_frame_and_flat_memory(num):
    stamps, stats, curve = _soak(num)
    assert stamps == [10 * SEC + i * SEC // 10 for i in range(num)]
    assert stats.rollovers == (num - 24 + 19) // 20 >= (20 if num >= 3000 else 15)
    # After warm-up (the first quarter) RSS may wander by allocator noise, not grow.
    settled = [rss for frame, rss in curve if frame > num // 4]
    assert max(settled) - min(settled) < 16.0, curve
