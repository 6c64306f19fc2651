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
"""StreamFeeder over the tiny random-weight StreamingSession on CPU: stamp checks, drops, resets.

Run: ``OMP_NUM_THREADS=1 python -m pytest test/engine/test_stream_feeder.py`` (a few seconds).
"""

from __future__ import annotations

from lingbot_map_ros.engine.errors import (CachePoolExhaustedError, NonFiniteOutputError,
                                           SessionLimitError)
from lingbot_map_ros.engine.frames import FrameTag
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.reasons import Reason
from lingbot_map_ros.engine.session.stream_feeder import FrameDrop, StreamFeeder
import numpy as np
import pytest
from tiny_engine import random_frame, tiny_session

N_S = 2
SEC = 10**9


def _session(**overrides) -> StreamingSession:
    return tiny_session({'cache.scale_frames': N_S}, overrides)


def _feed_all(feeder: StreamFeeder, stamps: list[int]) -> list[int]:
    """Feed one frame per stamp and return the stamps of the predictions that came out."""
    out = []
    for i, stamp in enumerate(stamps):
        fed = feeder.feed(random_frame(i), stamp)
        assert fed.accepted and not fed.resets and fed.drop is None
        out += [p.stamp_ns for p in fed.predictions]
    return out


def test_in_order_frames_pass_through():
    session = _session()
    feeder = StreamFeeder(session)
    stamps = [10 * SEC + i * SEC // 10 for i in range(N_S + 2)]
    assert _feed_all(feeder, stamps) == stamps
    assert feeder.last_stamp_ns == stamps[-1]
    assert session.stats().frames_out == N_S + 2


def test_stamps_not_newer_are_dropped_and_the_session_is_unchanged():
    session = _session()
    feeder = StreamFeeder(session, backwards_reset_s=1.0)
    _feed_all(feeder, [10 * SEC, 11 * SEC, 12 * SEC])
    before = session.stats().frames_in
    # Equal to the last stamp, then 0.5 s back: both below the 1 s reset threshold.
    for stamp in (12 * SEC, 12 * SEC - SEC // 2):
        fed = feeder.feed(random_frame(9), stamp)
        assert not fed.accepted and fed.predictions == [] and fed.resets == ()
        assert fed.drop == FrameDrop(
            Reason.STAMP_OUT_OF_ORDER,
            f'stamp {stamp * 1e-9:.6f} s is not after the previous 12.000000 s', FrameTag(stamp))
    assert session.stats().frames_in == before
    assert feeder.last_stamp_ns == 12 * SEC


def test_a_big_step_back_resets_and_the_frame_starts_the_new_session():
    session = _session()
    calls = []
    feeder = StreamFeeder(session, backwards_reset_s=1.0,
                          on_reset=lambda: calls.append(session.stats().frames_in))
    _feed_all(feeder, [10 * SEC, 11 * SEC, 12 * SEC])
    fed = feeder.feed(random_frame(5), 11 * SEC)  # exactly the threshold back
    [reset] = fed.resets
    assert (reset.reason, reset.detail) == ('clock_jump', 'stamp went back 1.000 s')
    assert reset.cleared == {'frames': 3, 'keyframes': 3, 'pending_frames': 0}
    assert reset.error is None and fed.drop is None and fed.accepted
    assert calls == [0]  # the hook ran on the emptied session, before the frame went in
    assert feeder.last_stamp_ns == 11 * SEC
    assert session.stats().frames_in == 1 and fed.predictions == []
    # The next frame completes the new scale phase, which starts at the jumped-to stamp.
    more = feeder.feed(random_frame(6), 11 * SEC + 1)
    assert [p.stamp_ns for p in more.predictions] == [11 * SEC, 11 * SEC + 1]


def test_time_index_limit_resets_and_the_frame_is_fed_again():
    # The session's own limit (the safety net behind rollovers): one session fills the table.
    session = _session(**{'model.max_frame_num': N_S + 1, 'stream.session_keyframes': N_S + 1,
                          'stream.overlap_keyframes': N_S})
    feeder = StreamFeeder(session)
    stamps = [SEC * (i + 1) for i in range(N_S + 1)]
    assert _feed_all(feeder, stamps) == stamps
    fed = feeder.feed(random_frame(7), 10 * SEC)
    [reset] = fed.resets
    assert reset.reason == 'time_index_limit' and 'max_frame_num' in reset.detail
    assert reset.cleared == {'frames': N_S + 1, 'keyframes': N_S + 1, 'pending_frames': 0}
    assert fed.accepted and fed.drop is None and fed.predictions == []
    assert feeder.last_stamp_ns == 10 * SEC
    stats = session.stats()
    assert (stats.frames_in, stats.frames_out, stats.pending_frames) == (1, 0, 1)
    more = feeder.feed(random_frame(8), 11 * SEC)
    assert [p.stamp_ns for p in more.predictions] == [10 * SEC, 11 * SEC]
    assert [p.frame_index for p in more.predictions] == [0, 1]


def test_a_second_limit_on_the_retry_gives_up_on_the_frame():
    session = _session()
    feeder = StreamFeeder(session)
    _feed_all(feeder, [SEC])
    failures = [SessionLimitError('some other limit'), CachePoolExhaustedError('still full')]
    calls = []

    def frame_job(tensor, info, tag, *args, **kwargs):  # the first feed and the retry plan
        calls.append(tag.stamp_ns)
        raise failures.pop(0)
    session.frame_job = frame_job
    fed = feeder.feed(random_frame(3), 5 * SEC)
    assert [(r.reason, r.detail) for r in fed.resets] == [('session_limit', 'some other limit'),
                                                          ('cache_full', 'still full')]
    assert [r.cleared['pending_frames'] for r in fed.resets] == [1, 0]
    assert calls == [5 * SEC, 5 * SEC]
    assert not fed.accepted and fed.drop is None and fed.predictions == []
    assert feeder.last_stamp_ns is None


def test_a_bad_frame_is_dropped_as_invalid_frame():
    session = _session()
    feeder = StreamFeeder(session)
    _feed_all(feeder, [SEC])
    fed = feeder.feed(np.zeros((64, 128, 3), np.float32), 2 * SEC)
    assert fed.drop == FrameDrop(Reason.INVALID_FRAME,
                                 'expected dtype uint8, got float32 (shape (64, 128, 3))',
                                 FrameTag(2 * SEC))
    assert not fed.accepted and fed.resets == () and fed.predictions == []
    assert session.stats().frames_in == 1
    # The stamp passed its check before the engine refused the frame, so it counts as seen.
    assert feeder.last_stamp_ns == 2 * SEC
    fed = feeder.feed(random_frame(1), 3 * SEC)
    assert [p.stamp_ns for p in fed.predictions] == [SEC, 3 * SEC]


def test_a_non_finite_pose_resets_without_feeding_the_frame_again():
    session = _session()
    feeder = StreamFeeder(session)
    _feed_all(feeder, [SEC])
    calls = []

    def frame_job(tensor, info, tag, *args, **kwargs):
        calls.append(tag.stamp_ns)
        raise NonFiniteOutputError('pose is NaN')
    session.frame_job = frame_job
    fed = feeder.feed(random_frame(1), 2 * SEC)
    [reset] = fed.resets
    assert (reset.reason, reset.detail) == ('nan_pose', 'pose is NaN')
    assert reset.cleared == {'frames': 0, 'keyframes': 0, 'pending_frames': 1}
    assert calls == [2 * SEC] and not fed.accepted and fed.drop is None
    assert feeder.last_stamp_ns is None


def test_other_errors_raise_unless_the_caller_asks_for_a_reset():
    session = _session()
    failure = RuntimeError('CUDA went away')

    def frame_job(tensor, info, tag, *args, **kwargs):
        raise failure
    session.frame_job = frame_job
    with pytest.raises(RuntimeError, match='CUDA went away'):
        StreamFeeder(session).feed(random_frame(), SEC)
    feeder = StreamFeeder(session, reset_on_error=True)
    fed = feeder.feed(random_frame(), SEC)
    [reset] = fed.resets
    assert (reset.reason, reset.detail, reset.error) == ('engine_error', 'CUDA went away',
                                                         failure)
    assert not fed.accepted and fed.drop is None and feeder.last_stamp_ns is None


def test_reset_forgets_the_last_stamp_and_runs_the_hook():
    session = _session()
    calls = []
    feeder = StreamFeeder(session, on_reset=lambda: calls.append('reset'))
    _feed_all(feeder, [5 * SEC])
    assert feeder.reset() == {'frames': 0, 'keyframes': 0, 'pending_frames': 1}
    assert calls == ['reset'] and feeder.last_stamp_ns is None
    # An older stamp is now simply the first of a new stream, not a clock jump.
    fed = feeder.feed(random_frame(), SEC)
    assert fed.accepted and fed.resets == () and fed.drop is None
