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
"""engine/cameras/camera_rig.py: the fused odometry's stamps only go forward (issue #36).

The rig's clock is the ``now_s`` each pose comes with, so every switch of the source is
driven here by explicit staleness: a camera whose last pose is more than ``stale_after_s``
older than ``now_s`` is stale.
"""

from __future__ import annotations

from lingbot_map_ros.engine.cameras.camera_rig import CameraRig
import numpy as np

SEC = 1_000_000_000
STAMP0 = 100 * SEC
PERIOD_NS = SEC // 10


def _pose(index: int) -> np.ndarray:
    out = np.eye(4)
    out[0, 3] = 0.01 * index
    return out


class _Run:
    """Feeds poses to a rig and records the stamps of the fused ones."""

    def __init__(self, names: list[str], primary: str) -> None:
        self.rig = CameraRig(names, primary, sync_tolerance_ns=5_000_000, stale_after_s=1.0)
        self.fused: list[int] = []
        self.skipped: list[tuple[str, int]] = []

    def add(self, name: str, index: int, now_s: float) -> None:
        stamp = STAMP0 + index * PERIOD_NS
        update = self.rig.add(name, stamp, _pose(index), now_s)
        if update.fused is not None:
            self.fused.append(stamp)
        if update.not_newer:
            self.skipped.append((name, index))


def _strictly_increasing(stamps: list[int]) -> bool:
    return all(b > a for a, b in zip(stamps, stamps[1:]))


def test_primary_back_after_a_pause_at_a_stamp_already_fused_is_skipped_and_counted():
    run = _Run(['front', 'left'], 'front')
    for i in range(5):
        run.add('front', i, i * 0.1)
        run.add('left', i, i * 0.1)
    for i in range(5, 21):  # front pauses: left takes over once front is stale (after 1 s)
        run.add('left', i, i * 0.1)
    assert run.rig.source == 'left'
    run.add('left', 21, 2.1)  # left's frame at t first, then front's at the same t
    run.add('front', 21, 2.1)
    assert run.rig.source == 'front' and run.skipped == [('front', 21)]
    for i in range(22, 25):
        run.add('front', i, i * 0.1)
        run.add('left', i, i * 0.1)
    assert _strictly_increasing(run.fused)
    assert run.fused[-4:] == [STAMP0 + i * PERIOD_NS for i in (21, 22, 23, 24)]
    assert run.rig.not_newer == 1 and run.rig.switches == 2


def test_primary_back_with_stamps_older_than_the_others_last_never_steps_back():
    run = _Run(['front', 'left'], 'front')
    for i in range(3):
        run.add('front', i, i * 0.1)
    for i in range(3, 25):
        run.add('left', i, i * 0.1)
    assert run.rig.source == 'left'
    for i in (20, 22, 24, 25, 26):  # front's clock lags behind left's last stamp (24)
        run.add('front', i, 2.5 + i * 0.01)
    assert run.rig.source == 'front'
    assert run.skipped == [('front', 20), ('front', 22), ('front', 24)]
    assert _strictly_increasing(run.fused)
    assert run.fused[-2:] == [STAMP0 + 25 * PERIOD_NS, STAMP0 + 26 * PERIOD_NS]
    assert run.rig.not_newer == 3


def test_flapping_primary_in_synchronised_groups_primary_first_never_repeats():
    # The node poses a group primary first (camera_group.py); the rig then never skips.
    run = _Run(['left', 'front'], 'front')
    now = 0.0
    for i in range(40):
        pause = (i // 8) % 2 == 1  # front sends 8 frames, pauses 8, ...
        now += 0.3
        if not pause:
            run.add('front', i, now)
        run.add('left', i, now)
    assert run.rig.switches >= 3
    assert _strictly_increasing(run.fused) and run.rig.not_newer == 0
    # Every instant fused once, but the 3 of each pause before front is stale (1 s > 0.9 s).
    assert len(run.fused) == 40 - 2 * 3


def test_flapping_primary_in_list_order_is_skipped_not_repeated():
    # The same flapping, each group fed in input.cameras order (left first): the primary's
    # pose at a stamp left's already gave is skipped and counted, never published twice.
    run = _Run(['left', 'front'], 'front')
    now = 0.0
    for i in range(40):
        pause = (i // 8) % 2 == 1
        now += 0.3
        run.add('left', i, now)
        if not pause:
            run.add('front', i, now)
    assert _strictly_increasing(run.fused)
    assert run.skipped == [('front', 16), ('front', 32)]  # front's first frame back
    assert run.rig.not_newer == 2 and len(run.fused) == 40 - 2 * 3


def test_the_primarys_reset_starts_the_stamps_again():
    run = _Run(['front', 'left'], 'front')
    for i in range(10, 15):
        run.add('front', i, i * 0.1)
    run.rig.clear('front')  # e.g. a clock jump back: a new odom
    for i in range(3):
        run.add('front', i, 1.5 + i * 0.1)
    assert run.fused[-3:] == [STAMP0 + i * PERIOD_NS for i in range(3)]
    assert run.rig.not_newer == 0
