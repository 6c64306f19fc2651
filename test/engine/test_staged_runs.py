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
"""A batch's slots' cache work at once (``cache/staged_runs.py``) equals each slot's own.

Three streams on one pool, their frames staged in three slots; per block, ``StagedRuns`` writes
all frames with one index and attends every run with one call of a several-run kernel. On the
CPU that kernel is a reference (SDPA per run over the bounds it is given), so what is checked
here is what ``StagedRuns`` adds: the slots' destinations and bounds, read from their staged
numbers, the frames' rows kept apart. The FA3 kernel itself: test_fa3_parts.py (Triton) and
test_whole_batch.py (a whole batch on the GPU).

Run: ``python -m pytest test/engine/test_staged_runs.py``.
"""

from __future__ import annotations

from lingbot_map_ros.engine.attention.page_gather import attend_tokens
from lingbot_map_ros.engine.cache import KVPool, StreamKV
from lingbot_map_ros.engine.cache.staged_frames import StagedFrames
from lingbot_map_ros.engine.cache.staged_runs import joint_kernel, StagedRuns
from lingbot_map_ros.engine.cache.stream_kv import stream_pages
from lingbot_map_ros.kernel_config import KernelConfig
import pytest
import torch

BLOCKS, HEADS, DIM, SPECIALS, PATCHES = 2, 2, 8, 6, 10
SCALE, WINDOW, STREAMS = 2, 3, 3


def reference_runs(q, k, v, bounds):
    """Run b's queries over ``k[start_b:stop_b]`` (the several-run kernel's contract)."""
    return torch.stack([attend_tokens(q[b], k[lo:hi], v[lo:hi])
                        for b, (lo, hi) in enumerate(bounds[:, :2].tolist())])


def _streams(kernel: KernelConfig | None = None) -> list[StreamKV]:
    pages = stream_pages(PATCHES, SPECIALS, SCALE, WINDOW, 32)
    pool = KVPool(num_layers=BLOCKS, num_pages=STREAMS * pages, page_size=PATCHES,
                  num_heads=HEADS, head_dim=DIM, num_special_tokens=SPECIALS,
                  dtype=torch.float64, device=torch.device('cpu'), backend='sdpa',
                  full_patch_pages=SCALE + WINDOW, kernel=kernel)
    return [StreamKV(pool, SCALE, WINDOW, 32) for _ in range(STREAMS)]


def _scale_pass(kv: StreamKV, gen: torch.Generator) -> None:
    plan = kv.plan_frame('scale', SCALE)
    for b in range(BLOCKS):
        k, v = (torch.randn(SCALE * (SPECIALS + PATCHES), HEADS, DIM, generator=gen,
                            dtype=torch.float64) for _ in range(2))
        kv.write(plan, b, k, v)
    kv.end_frame(plan)


def test_staged_runs_equal_each_slots_own_write_and_attention():
    gen = torch.Generator().manual_seed(4)
    tokens = SPECIALS + PATCHES
    # Stream s has 1 + s frames past its scale pass: the runs differ in length and place.
    lanes, joint = _streams(), _streams()
    for kvs in (lanes, joint):
        for s, kv in enumerate(kvs):
            _scale_pass(kv, torch.Generator().manual_seed(10 + s))
    slots = {id(kvs): [StagedFrames(kvs[0].pool) for _ in kvs] for kvs in (lanes, joint)}
    for step in range(4):  # the third keyframe fills the window; the fourth slides it
        frames = torch.randn(STREAMS, BLOCKS, 3, tokens, HEADS, DIM, generator=gen,
                             dtype=torch.float64)
        keyframe = step != 1
        keys = {id(kvs): [slot.stage_frame(kv, keyframe)
                          for slot, kv in zip(slots[id(kvs)], kvs)] for kvs in (lanes, joint)}
        runs = StagedRuns(slots[id(joint)], reference_runs)
        for block in range(BLOCKS):
            want = []
            for s, slot in enumerate(slots[id(lanes)]):
                slot.write(block, frames[s, block, 1], frames[s, block, 2])
                want.append(slot.attend(block, keys[id(lanes)][s], frames[s, block, 0]))
            got = runs.run(block, frames[:, block, 0].contiguous(),
                           frames[:, block, 1].contiguous(), frames[:, block, 2].contiguous())
            assert got.shape == (STREAMS, tokens, HEADS, DIM)
            for s in range(STREAMS):
                torch.testing.assert_close(got[s], want[s], atol=1e-12, rtol=1e-12)
        for kvs in (lanes, joint):
            for slot in slots[id(kvs)]:
                slot.finish()
    storage = (lanes[0].pool.storage, joint[0].pool.storage)
    for block in range(BLOCKS):
        assert torch.equal(storage[0].k[block], storage[1].k[block])
        assert torch.equal(storage[0].v[block], storage[1].v[block])
    assert [kv.stats() for kv in lanes] == [kv.stats() for kv in joint]
    assert lanes[0].stats()['live_pages'] == WINDOW  # the window filled and slid


def test_joint_runs_only_where_the_form_has_a_several_run_kernel(monkeypatch):
    kvs = _streams()
    slots = [StagedFrames(kvs[0].pool) for _ in kvs]
    # The sdpa form (splits full windows, merges on its own) has none: slot by slot.
    assert joint_kernel(slots, [('range',)] * STREAMS) is None

    # A form with a several-run kernel, as a slot hands it on.
    for slot in slots:
        monkeypatch.setattr(slot, 'joint_kernel', lambda: reference_runs)
    assert joint_kernel(slots, [('range',)] * STREAMS) is reference_runs
    assert joint_kernel(slots[:1], [('range',)]) is None  # one slot: nothing to join
    assert joint_kernel(slots, [('range',), ('split', 0, 10), ('range',)]) is None

    # cache.kernel.staged_runs false (the pool's kernel config): slot by slot.
    kvs = _streams(KernelConfig(staged_runs=False))
    slots = [StagedFrames(kvs[0].pool) for _ in kvs]
    for slot in slots:
        monkeypatch.setattr(slot, 'joint_kernel', lambda: reference_runs)
    assert joint_kernel(slots, [('range',)] * STREAMS) is None


def test_a_batch_whose_rows_do_not_match_the_slots_is_refused():
    kvs = _streams()
    slots = [StagedFrames(kvs[0].pool) for _ in kvs]
    for s, kv in enumerate(kvs):
        _scale_pass(kv, torch.Generator().manual_seed(s))
        slots[s].stage_frame(kv, True)
    runs = StagedRuns(slots, reference_runs)
    two = torch.zeros(2, SPECIALS + PATCHES, HEADS, DIM, dtype=torch.float64)
    with pytest.raises(ValueError, match='2 frame'):  # 2 frames' K/V for 3 slots
        runs.run(0, two, two, two)
