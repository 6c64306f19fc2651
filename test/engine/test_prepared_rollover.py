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
"""The next session prepared unit by unit (engine/scale_pass.py), tiny model (CPU).

Run: ``OMP_NUM_THREADS=1 python -m pytest test/engine/test_prepared_rollover.py`` (~1 min).
"""

from __future__ import annotations

import logging

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.cache.capacity import pool_pages
from lingbot_map_ros.engine.cache.stream_kv import prep_pages, stream_pages
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.image.preprocess import preprocess_image
from lingbot_map_ros.engine.scale_pass import scale_units
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.rollover import RolloverSession
import numpy as np
import pytest
from tiny_engine import random_frames, tiny_config
import torch

N_S, WINDOW = 2, 3
PAGE = (56 // 14) * (112 // 14)  # patches of a 56 x 112 frame: one page


def _config(**overrides) -> EngineConfig:
    return tiny_config({'stream.enable_depth': True, 'cache.scale_frames': N_S,
                        'cache.sliding_window': WINDOW, 'cache.max_total_frames': 16,
                        'model.max_frame_num': 16, 'stream.session_keyframes': 16,
                        'stream.overlap_keyframes': N_S}, overrides)


def _images(count: int, seed: int) -> list[torch.Tensor]:
    return [preprocess_image(frame, 112, 14)[0] for frame in random_frames(count, seed)]


@pytest.mark.parametrize('depth', [True, False])
def test_the_pass_unit_by_unit_between_other_frames_equals_the_pass_at_once(depth):
    # Without depth the pass keeps of its taps only the camera tokens (Aggregator.block_steps).
    engine = Engine.load(_config(**{'cache.streams': 3, 'stream.enable_depth': depth}),
                         allow_random_weights=True, seed=5)
    scale = torch.stack(_images(N_S, seed=1))
    later = _images(3, seed=2)
    other = _images(40, seed=3)
    size = tuple(scale.shape[-2:])
    # The reference: the scale pass at once, then streaming keyframes.
    ref = engine.open_stream()
    ref.start(size)
    want = [ref.forward_scale(scale, with_depth=depth)]
    # A stream that serves frames while the prepared one runs a unit after each.
    busy = engine.open_stream()
    busy.start(size)
    busy.forward_scale(torch.stack(other[:N_S]), with_depth=True)
    prepared = engine.open_stream()
    work = prepared.scale_pass(scale, with_depth=depth)
    assert work.units == scale_units(N_S, engine.config.model.depth, depth) \
        == (2 if depth else 1) * N_S + 4 + 1
    # While it is prepared it holds only its scale pages (and their special page).
    free = engine.pool_stats().pool_pages_free
    assert engine.pool.num_pages - free == 2 * stream_pages(PAGE, 6, N_S, WINDOW, 16) \
        + prep_pages(PAGE, 6, N_S)
    for i in range(work.units):
        assert not work.done and work.done_units == i
        busy.forward_frame(other[N_S + i][None], N_S + i, keyframe=i % 2 == 0, with_depth=True)
        work.step()
    assert work.done and work.done_units == work.units
    got = [work.install()]
    assert engine.pool_stats().pool_pages_free == free - stream_pages(PAGE, 6, N_S, WINDOW, 16) \
        + prep_pages(PAGE, 6, N_S)  # the full extent leased, the scale pages given back
    for t, image in enumerate(later, start=N_S):
        want.append(ref.forward_frame(image[None], t, keyframe=True, with_depth=depth))
        got.append(prepared.forward_frame(image[None], t, keyframe=True, with_depth=depth))
    for a, b in zip(got, want):
        # The same work in another order and DINO per frame: equal up to float rounding.
        np.testing.assert_allclose(a['pose_enc'].numpy(), b['pose_enc'].numpy(), atol=1e-4)
        assert ('depth' in a) == ('depth' in b) == depth
        if depth:
            np.testing.assert_allclose(a['depth'].numpy(), b['depth'].numpy(), rtol=1e-4,
                                       atol=1e-4)
    # The copied cache is what the reference wrote: the later frames attend to it.
    assert np.abs(np.diff(np.stack([g['pose_enc'][0].numpy() for g in got]), axis=0)).max() > 1e-4


def _run_rollover(num: int, fast: bool = False,
                  **overrides) -> tuple[list, RolloverSession, list]:
    session = StreamingSession(_config(**overrides), allow_random_weights=True, seed=5)
    if fast:  # the GPU's whole-frame path: the same steps, run uncaptured on the CPU
        session.engine.fast_path.request('whole_frame', False)
    rollover = RolloverSession(session)
    out, pools = [], []
    info = preprocess_image(np.zeros((64, 128, 3), np.uint8), 112, 14)[1]
    for i, image in enumerate(_images(num, seed=4)):
        out += rollover.step_tensor(image, info, i)
        pools.append((session.engine.pool_stats(), rollover.rollover_stats()))
        if i == 0:
            camera = session.stream.state.camera
            heads = session.engine.runner.heads
            built, generation = dict(heads.step_builds), camera.generation
    # The serving stream keeps one camera-head cache (the one its captured step reads): the
    # next session's scale frames move into it at the switch.
    assert session.stream.state.camera is camera and camera.num_frames > 0
    if fast:
        # Nothing is built after the warm-up (on a GPU each build is a capture, a slow frame):
        # the preparations' DINO step was built there, the camera cache never grew.
        assert built['dino trunk'] == 1 and built['camera head'] >= 1
        assert heads.step_builds == built and camera.generation == generation
    return out, rollover, pools


def test_after_the_warm_up_prepared_rollovers_build_nothing_and_match_the_eager_run():
    fast, rollover, _ = _run_rollover(40, fast=True)
    eager, _, _ = _run_rollover(40)
    assert rollover.rollover_stats().rollovers >= 2
    assert [p.stamp_ns for p in fast] == [p.stamp_ns for p in eager] == list(range(40))
    np.testing.assert_allclose(np.stack([p.c2w for p in fast]),
                               np.stack([p.c2w for p in eager]), atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_on_cuda_units_launched_while_captured_frames_run_match_the_eager_run():
    # Each unit's eager kernels are queued behind a replayed batch graph, before the frame's
    # outputs are read: they must neither disturb the frame nor be disturbed by it.
    cuda = {'stream.device': 'cuda', 'stream.enable_depth': False}
    fast, rollover, _ = _run_rollover(40, fast=True, **cuda)
    eager, _, _ = _run_rollover(40, **cuda)
    stats = rollover.rollover_stats()
    assert stats.rollovers >= 2 and stats.unprepared_switches == 0
    assert sum(rollover.session.engine.fast_path.fallbacks().values()) == 0
    assert [p.stamp_ns for p in fast] == [p.stamp_ns for p in eager] == list(range(40))
    # bf16 on the GPU, captured against eager kernels: equal within bf16 rounding.
    np.testing.assert_allclose(np.stack([p.c2w for p in fast]),
                               np.stack([p.c2w for p in eager]), rtol=5e-2, atol=5e-2)


def test_prepared_rollovers_publish_every_frame_once_and_keep_the_pool_bounded():
    num = 60
    out, rollover, pools = _run_rollover(num)
    stats = rollover.rollover_stats()
    lead = rollover.lead_keyframes
    assert lead == scale_units(N_S, 4, True) == 9
    assert [p.stamp_ns for p in out] == list(range(num))
    assert [p.frame_index for p in out] == list(range(num))
    assert stats.rollovers >= 4 and stats.unprepared_switches == 0
    assert stats.last_switch_units == 0
    # Every session but the last ran its successor's pass one unit per frame, just before
    # its limit; the switch frames ran none.
    switched = [i for i, p in enumerate(out) if 'rollover' in p.timings_ms]
    prepared = [i for i, p in enumerate(out) if 'prepare' in p.timings_ms]
    assert len(switched) == stats.rollovers
    for s in switched:
        assert [i for i in prepared if s - lead <= i < s] == list(range(s - lead, s))
    assert len(prepared) == lead * stats.rollovers + sum(
        1 for i in prepared if i > switched[-1])
    # At most the running stream plus the next session's scale pages; one stream right
    # after each switch (no page lost).
    total = pool_pages(_config().cache, PAGE)
    states = {st.preparation for _, st in pools}
    assert states == {'idle', 'preparing', 'ready'}
    for pool, st in pools:
        held = total - pool.pool_pages_free
        want = stream_pages(PAGE, 6, N_S, WINDOW, 16) + (
            prep_pages(PAGE, 6, N_S) if st.preparation != 'idle' else 0)
        assert held == want and pool.pool_streams == 1 + (st.preparation != 'idle')


def test_a_session_as_short_as_overlap_and_lead_is_prepared_from_its_first_frame():
    # N_s overlap keyframes + 9 units: the preparation must start with the switch frame.
    out, rollover, _ = _run_rollover(40, **{'stream.session_keyframes': N_S + 9})
    stats = rollover.rollover_stats()
    assert rollover.lead_keyframes == 9
    assert [p.stamp_ns for p in out] == list(range(40))
    assert stats.rollovers >= 3 and stats.unprepared_switches == 0
    switched = [i for i, p in enumerate(out) if 'rollover' in p.timings_ms]
    assert all('prepare' in out[s].timings_ms for s in switched[:-1])


def test_a_pool_without_headroom_still_rolls_over_at_the_switch(caplog):
    per_stream = stream_pages(PAGE, 6, N_S, WINDOW, 16)
    with caplog.at_level(logging.WARNING):
        out, rollover, _ = _run_rollover(40, **{'cache.pool_pages': per_stream})
    stats = rollover.rollover_stats()
    assert [p.stamp_ns for p in out] == list(range(40))
    assert stats.rollovers >= 2 and stats.unprepared_switches == stats.rollovers
    assert stats.last_switch_units == scale_units(N_S, 4, True)
    assert 'preparing the next session failed' in caplog.text


@pytest.mark.parametrize('overlap', [N_S, N_S + 2])
def test_prepared_and_stalled_switches_give_the_same_trajectory(overlap):
    # The same frames with a pool without headroom (every pass runs at the switch) and with
    # one (every pass prepared ahead): the same overlap, the same poses up to rounding.
    values = {'stream.overlap_keyframes': overlap}
    prepared, rollover, _ = _run_rollover(44, **values)
    stalled, other, _ = _run_rollover(44, **values, **{
        'cache.pool_pages': stream_pages(PAGE, 6, N_S, WINDOW, 16)})
    assert rollover.rollover_stats().unprepared_switches == 0
    assert other.rollover_stats().unprepared_switches == other.rollover_stats().rollovers >= 2
    assert [p.session for p in prepared] == [p.session for p in stalled]
    np.testing.assert_allclose(np.stack([p.c2w for p in prepared]),
                               np.stack([p.c2w for p in stalled]), atol=1e-4)
