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
"""The step at a rollover frame, judged with the oracle model (issue #36, "scale jumps").

A hostile round saw 13 of the 14 largest frame-to-frame steps at rollover frames, with the tiny
random-weight model, whose sessions share no geometry. The oracle (``oracle_model.py``: the
ground truth through a random Sim(3) per session, plus 0.2 % pose noise) is a model whose
sessions agree: there the step of the frame where the next session takes over, over the true
step, is measured against every other frame's. Pose-only stitching (a Sim(3) on the overlap's
positions) makes that step noisier (about twice the others' median error at the default overlap
of 8 keyframes); with depth (the overlap's depth ratio sets the scale) it is like any other.
"""

from __future__ import annotations

from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.engine.session.stream_feeder import StreamFeeder
import numpy as np
from oracle_model import frame_image, ground_truth, oracle_session
import pytest

SEC = 10**9


def _step_errors(depth: bool, seed: int, num: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Return |log(step / true step)| (over their median) at rollover frames and elsewhere."""
    gt = ground_truth(num + 10)
    values = {'stream.session_keyframes': 24, 'stream.overlap_keyframes': 8,
              'model.max_frame_num': 24, 'stream.enable_depth': depth}
    session, _ = oracle_session(gt, seed=seed, noise=0.002, **values)
    rollover = RolloverSession(session)
    feeder = StreamFeeder(rollover)
    preds = []
    for i in range(num):
        preds += feeder.feed(frame_image(i), 100 * SEC + i * SEC // 10).predictions
    preds += rollover.flush()
    est = np.stack([p.c2w for p in preds])[:, :3, 3]
    true = gt[:len(preds), :3, 3]
    ratio = (np.linalg.norm(np.diff(est, axis=0), axis=1)
             / np.linalg.norm(np.diff(true, axis=0), axis=1))
    error = np.abs(np.log(ratio / np.median(ratio)))
    at = np.nonzero(np.diff([p.session for p in preds]))[0]
    return error[at], np.delete(error, at)


@pytest.mark.parametrize('depth, bound', [(False, 2.5), (True, 1.5)])
def test_the_rollover_frames_step_is_bounded_against_the_others(depth, bound):
    at, others = _step_errors(depth, seed=4)
    assert len(at) >= 8
    # Measured (seeds 3-5): pose only, median 0.15 at rollovers vs 0.08-0.09 elsewhere, max
    # e^1.2; with depth 0.07-0.09 vs 0.07-0.10, max e^0.22.
    assert np.median(at) <= bound * np.median(others)
    assert np.max(at) <= (1.3 if not depth else 0.5)
