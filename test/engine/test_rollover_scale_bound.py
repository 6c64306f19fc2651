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
"""A rollover may not change the scale by more than ``stitching.MAX_SCALE_CHANGE`` (issue 22, o).

The oracle model (``oracle_model.py``) draws each session's scale; here some sessions are
outliers (their scale 1e-4 or 1e4 times the usual) and the trajectory must keep its scale: the
implausible fits are refused, counted and reported, the previous scale kept.
"""

from __future__ import annotations

from lingbot_map_ros.engine.session import stitching
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.engine.session.stream_feeder import StreamFeeder
import numpy as np
from oracle_model import frame_image, ground_truth, oracle_session
import pytest

SEC = 10**9


def _run_with_outliers(num: int, outliers: dict[int, float], depth: bool) -> tuple:
    gt = ground_truth(num + 10)
    values = {'stream.session_keyframes': 24, 'stream.overlap_keyframes': 4,
              'model.max_frame_num': 24, 'stream.enable_depth': depth}
    session, _ = oracle_session(gt, seed=3, outliers=outliers, **values)
    rollover = RolloverSession(session)
    feeder = StreamFeeder(rollover)
    preds = []
    for i in range(num):
        fed = feeder.feed(frame_image(i), 100 * SEC + i * SEC // 10)
        assert fed.accepted and fed.resets == (), (i, fed)
        preds += fed.predictions
    preds += rollover.flush()
    return preds, rollover.rollover_stats(), gt[:num]


@pytest.mark.parametrize('depth', [False, True])
def test_outlier_sessions_are_refused_and_the_scale_holds(depth):
    # The oracle's sessions 2 and 4 are outliers (1e-4 and 1e4 times their drawn scale).
    preds, stats, gt = _run_with_outliers(130, {2: 1e-4, 4: 1e4}, depth)
    assert len(preds) == 130 and stats.rollovers >= 5
    assert stats.rejected_scales >= 2
    est = np.stack([p.c2w for p in preds])
    assert np.isfinite(est).all()
    # Frame-to-frame steps in continuous units over ground-truth steps, first vs last session.
    steps = np.linalg.norm(np.diff(est[:, :3, 3], axis=0), axis=1)
    truth = np.linalg.norm(np.diff(gt[:, :3, 3], axis=0), axis=1)
    sessions = np.array([p.session for p in preds[1:]])
    ratio = steps / truth
    first, last = np.median(ratio[sessions == sessions.min()]), \
        np.median(ratio[sessions == sessions.max()])
    # A session after a refused one starts from the kept scale, so it carries that session's
    # own (oracle-drawn, up to e^2) scale difference; the 1e4 outliers never carry on.
    assert 1.0 / stitching.MAX_SCALE_CHANGE < last / first < stitching.MAX_SCALE_CHANGE


def test_without_the_bound_an_outlier_would_carry_its_scale_on():
    ref = ground_truth(6)
    ses = ref.copy()
    ses[:, :3, 3] *= 1e-4  # an outlier session: 1e4 times smaller
    free = stitching.align_sim3(ref, ses)
    assert free.scale == pytest.approx(1e4, rel=1e-6) and free.rejected_scale is None
    bound = stitching.fit_rollover(ref, ses, previous_scale=1.0)
    assert bound.scale == 1.0 and bound.rejected_scale == pytest.approx(1e4, rel=1e-6)
    # Within the bound the fit is taken.
    ses[:, :3, 3] = ref[:, :3, 3] / 3.0
    taken = stitching.fit_rollover(ref, ses, previous_scale=1.0)
    assert taken.scale == pytest.approx(3.0, rel=1e-6) and taken.rejected_scale is None
    with pytest.raises(ValueError, match='max_change'):
        stitching.fit_rollover(ref, ses, 1.0, max_change=1.0)


def test_depth_ratio_outliers_are_bounded_too():
    ref = ground_truth(6)
    depths = ([np.full((4, 4), 2.0)] * 6, [np.full((4, 4), 2e-5)] * 6)  # ratio 1e5
    fit = stitching.fit_rollover(ref, ref.copy(), previous_scale=2.0, depths=depths)
    assert fit.scale == 2.0 and fit.rejected_scale == pytest.approx(1e5, rel=1e-6)
