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
"""Glitch filters of StreamFeeder (engine/session/stream_guards.py) over the tiny CPU session.

One frame stamped ahead of the stream, or one frame of another size, must cost that frame only:
not the frames after it, not the map.

Run: ``OMP_NUM_THREADS=1 python -m pytest test/engine/test_stream_guards.py`` (a few seconds).
"""

from __future__ import annotations

from lingbot_map_ros.engine.frames import FrameTag
from lingbot_map_ros.engine.session.stream_feeder import FrameHeld, StreamFeeder
from lingbot_map_ros.engine.session.stream_guards import ForwardJumpGuard, ResolutionGuard
from tiny_engine import random_frame, tiny_session

N_S = 2
SEC = 10**9
MS = 10**6


def _feeder(**kwargs) -> StreamFeeder:
    return StreamFeeder(tiny_session({'cache.scale_frames': N_S}), **kwargs)


def test_threshold_follows_the_cadence_with_a_floor():
    guard = ForwardJumpGuard(forward_jump_s=0.1)
    assert guard.threshold_ns() == 100 * MS
    last = 0
    for stamp in (33 * MS, 66 * MS, 100 * MS):
        assert guard.check(last, stamp) is None
        last = stamp
    assert guard.threshold_ns() == 4 * 33 * MS  # median step 33 ms
    assert guard.check(last, last + 200 * MS) is not None  # 200 ms > 4 x 33 ms
    slow = ForwardJumpGuard(forward_jump_s=0.1)
    assert slow.check(0, SEC) is None  # the first step only teaches the cadence
    assert slow.threshold_ns() == 4 * SEC
    assert slow.check(SEC, 2 * SEC) is None  # a 1 Hz camera is not a jump
    assert ForwardJumpGuard(0.0).check(0, 10 * SEC) is None  # off


def test_one_frame_stamped_ahead_is_dropped_and_the_following_frames_are_kept():
    feeder = _feeder(forward_jump_s=0.1)
    stamps = [10 * SEC + i * 33 * MS for i in range(12)]
    glitch = stamps[5] + SEC  # one frame stamped 1 s ahead, between frames 5 and 6
    out, drops = [], []
    for i, stamp in enumerate(stamps[:6] + [glitch] + stamps[6:]):
        fed = feeder.feed(random_frame(i), stamp)
        out += [p.stamp_ns for p in fed.predictions]
        drops += [d.reason for d in (fed.drop, fed.held_drop) if d is not None]
        assert not fed.resets
    assert drops == ['stamp_jump_ahead']
    assert out == stamps  # not one good frame lost
    assert feeder.last_stamp_ns == stamps[-1]


def test_a_real_gap_costs_no_frame_the_held_one_is_fed_with_the_next():
    feeder = _feeder(forward_jump_s=0.1)
    before = [10 * SEC + i * 33 * MS for i in range(4)]
    after = [20 * SEC + i * 33 * MS for i in range(3)]  # the stream resumes 10 s later
    results = [feeder.feed(random_frame(i), s) for i, s in enumerate(before + after)]
    held = results[len(before)]
    # A typed verdict, not a drop: the frame is neither taken nor refused yet.
    assert isinstance(held.held, FrameHeld) and held.held.tag == FrameTag(after[0])
    assert held.held.detail.startswith('stamp 20.000000 s is 9.901 s after the previous 10.0990')
    assert not held.accepted and not held.predictions and held.drop is None
    assert held.held_drop is None and held.resets == ()
    confirm = results[len(before) + 1]
    assert [p.stamp_ns for p in confirm.predictions] == after[:2]  # held frame first
    assert confirm.held_drop is None and confirm.accepted and confirm.held is None
    assert feeder.held is None
    out = [p.stamp_ns for r in results for p in r.predictions]
    assert out == before + after


def test_a_frame_ahead_followed_by_an_out_of_order_frame_is_still_an_outlier():
    feeder = _feeder(forward_jump_s=0.1)
    stamps = [10 * SEC + i * 33 * MS for i in range(4)]
    for i, stamp in enumerate(stamps):
        feeder.feed(random_frame(i), stamp)
    ahead = FrameTag(stamps[-1] + 5 * SEC, 'cam', 1.5)
    hold = feeder.feed(random_frame(9), ahead).held
    assert feeder.held == hold and hold.tag is ahead
    fed = feeder.feed(random_frame(10), stamps[-1])  # a duplicate of the last stamp
    assert fed.held_drop.reason == 'stamp_jump_ahead'
    assert fed.held_drop.tag is ahead and fed.held_drop.detail == hold.detail
    assert fed.drop.reason == 'stamp_out_of_order'
    assert feeder.held is None and feeder.last_stamp_ns == stamps[-1]


def test_finish_runs_buffered_scale_frames_and_drops_a_held_frame():
    feeder = _feeder(forward_jump_s=0.1)
    first = FrameTag(10 * SEC, 'cam')
    assert feeder.feed(random_frame(0), first).predictions == []  # N_s = 2: buffered
    end = feeder.finish()
    assert [p.tag for p in end.predictions] == [first] and end.held_drop is None
    feeder.reset()
    stamps = [10 * SEC + i * 33 * MS for i in range(3)]
    out = [p.stamp_ns for i, t in enumerate(stamps)
           for p in feeder.feed(random_frame(i), t).predictions]
    assert out == stamps
    last = FrameTag(stamps[-1] + 5 * SEC)
    assert feeder.feed(random_frame(3), last).held.tag is last
    end = feeder.finish()  # nothing can confirm the last frame: it was an outlier
    assert end.held_drop.reason == 'stamp_jump_ahead' and end.held_drop.tag is last
    assert end.drop is None and end.resets == () and end.predictions == []
    assert feeder.held is None


def test_a_glitch_frame_of_another_size_keeps_the_map():
    feeder = _feeder(resolution_change_frames=3)
    stamps = [SEC * (i + 1) // 10 for i in range(8)]
    sizes = [(64, 128)] * 3 + [(128, 128)] + [(64, 128)] * 4
    reasons, out = [], []
    for i, (stamp, size) in enumerate(zip(stamps, sizes)):
        fed = feeder.feed(random_frame(i, size), stamp)
        assert not fed.resets
        reasons.append(fed.drop.reason if fed.drop else None)
        out += [p.stamp_ns for p in fed.predictions]
    assert reasons == [None] * 3 + ['resolution_mismatch'] + [None] * 4
    assert out == stamps[:3] + stamps[4:]


def test_a_lasting_size_change_starts_a_new_map_at_the_nth_frame():
    feeder = _feeder(resolution_change_frames=3)
    for i in range(3):
        feeder.feed(random_frame(i), (i + 1) * SEC)
    results = [feeder.feed(random_frame(i, (128, 128)), (i + 4) * SEC) for i in range(4)]
    assert [r.drop.reason if r.drop else None for r in results] == [
        'resolution_mismatch', 'resolution_mismatch', None, None]
    assert [r.reason for r in results[2].resets] == ['resolution_changed']
    assert results[2].accepted and results[3].accepted
    # The new map holds the frame that made the change and the ones after it.
    assert [p.stamp_ns for p in results[3].predictions] == [6 * SEC, 7 * SEC]


def test_resolution_guard_counts_consecutive_frames_of_one_size():
    guard = ResolutionGuard(change_frames=3)
    assert not guard.observe((1, 2)) and not guard.observe((1, 2))
    assert not guard.observe((3, 4)) and guard.pending == 1  # another size starts over
    assert not guard.observe((3, 4)) and guard.observe((3, 4))
    assert guard.pending == 0
    assert ResolutionGuard(change_frames=1).observe((5, 6))
