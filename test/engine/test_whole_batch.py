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
"""A batch of several streams' frames run whole (staged cache attention) equals each stream alone.

On the CPU the whole batch runs eagerly: the same segments and the same staged writes and
attentions, in the order the GPU captures them (``model/whole_batch.py``). On CUDA (marker
gpu) the batch is one captured graph, compared with each stream's own whole-frame graphs.

Schedule (N_s 2, W 3, ``tiny_stream.CACHE``, K 2): stream b starts b steps after stream 0, so
a batch holds streams whose windows are filling beside full, sliding ones, and keyframes beside
non-keyframes (neighbouring streams are one frame apart).

Run: ``python -m pytest test/engine/test_whole_batch.py`` (tiny golden-weights model).
"""

from __future__ import annotations

import dataclasses

from lingbot_map_ros.engine.cache import new_kv_pool, StreamKV
from lingbot_map_ros.engine.model.batched import BatchCall, BatchGraphs
from lingbot_map_ros.engine.model.fast_path import FastPathState
from lingbot_map_ros.engine.model.frame_runner import FrameRunner
from lingbot_map_ros.engine.model.stream_state import StreamState
from lingbot_map_ros.kernel_config import KernelConfig
import pytest
# tiny_engine and tiny_stream sit next to this file (pytest puts test/engine on sys.path).
from tiny_engine import random_images
from tiny_stream import CACHE, new_stream, tiny_model
import torch

N_S = CACHE.scale_frames
KEYS = ('pose_enc', 'pose_enc_iters', 'depth', 'depth_conf')
Call = tuple[int, int, bool]
"""(frame index, time index, keyframe)."""


def _calls(count: int) -> list[Call]:
    """Return the streaming calls of ``count`` frames: even frames are keyframes."""
    calls, cached = [], N_S
    for i in range(N_S, count):
        keyframe = i % 2 == 0
        calls.append((i, cached, keyframe))
        cached += keyframe
    return calls


def _kv_dtype(model) -> torch.dtype:
    """Return the pools' dtype: the aggregator's (bf16 on CUDA, which stages; fp32 on CPU)."""
    return model.aggregator.camera_token.dtype


def _alone(model, images: torch.Tensor, runner=None) -> list[dict]:
    """Each streaming frame of one stream, alone on a pool of its own (the reference)."""
    state = new_stream(model, _kv_dtype(model), images)
    model.forward_scale(images[:N_S], state, with_depth=True, runner=runner)
    return [model.forward_frame(images[i:i + 1], t, key, state, with_depth=True, runner=runner)
            for i, t, key in _calls(images.shape[0])]


def _shared_streams(model, images: list[torch.Tensor], cache=CACHE) -> list[StreamState]:
    cache = dataclasses.replace(cache, streams=len(images))
    pool = new_kv_pool(model.config, cache, _kv_dtype(model), images[0].shape[-2:],
                       images[0].device)
    return [StreamState(model.new_camera_cache(), StreamKV.for_cache(pool, cache))
            for _ in images]


def _batched(model, images: list[torch.Tensor], graphs: BatchGraphs,
             fail_at: int = -1, runner=None, cache=CACHE) -> tuple[list[list[dict]], int]:
    """Run the streams on one pool, every step's streaming frames as one batch.

    ``fail_at``: that step's batch first fails once in frame block 1 (after global block 0's
    cache writes); the rolled-back streams must then equal streams that never saw it.
    ``runner``: the heads' fast path (captured camera-head steps), for lone frames too.
    ``cache``: the pool's settings (backend, storage dtype).

    Returns:
        Per stream its frames' outputs, and the batches of two frames or more.
    """
    states = _shared_streams(model, images, cache)
    calls = [_calls(imgs.shape[0]) for imgs in images]
    outs: list[list[dict]] = [[] for _ in images]
    batches, failed = 0, fail_at < 0
    for step in range(len(images) + max(len(c) for c in calls)):
        ready = []
        for b, state in enumerate(states):
            local = step - b
            if local == 0:
                model.forward_scale(images[b][:N_S], state, with_depth=True)
            elif 1 <= local <= len(calls[b]):
                ready.append((b, calls[b][local - 1]))
        if len(ready) == 1:
            b, (i, t, key) = ready[0]
            outs[b].append(model.forward_frame(images[b][i:i + 1], t, key, states[b],
                                               with_depth=True, runner=runner))
        elif ready:
            if step == fail_at:
                _fail_once(model, images, states, ready, graphs)
                failed = True
            batch = _batch(model, images, states, ready, graphs, runner)
            for (b, _), out in zip(ready, batch):
                outs[b].append(out)
            batches += 1
    assert failed, 'the failing step ran no batch'
    return outs, batches


def _batch(model, images, states, ready, graphs, runner=None) -> list[dict]:
    agg = model.aggregator
    calls, rows = [], []
    for b, (i, t, key) in ready:
        role = 'keyframe' if key else 'non-keyframe'
        patch_hw = agg.prepare(images[b][i:i + 1], t, role, states[b].kv)
        calls.append((states[b], BatchCall(states[b].kv, t, role)))
        rows.append(images[b][i:i + 1])
    return model.forward_batch(torch.cat(rows), calls, patch_hw, with_depth=True,
                               runner=runner, graphs=graphs)


def _fail_once(model, images, states, ready, graphs) -> None:
    """Run the batch with frame block 1 raising; every stream must be as it was."""
    keyframes = [key for _, (_, _, key) in ready]
    assert len(ready) == len(states) and any(keyframes) and not all(keyframes)
    before = [(s.kv.num_frames, s.kv.stats()) for s in states]

    def refuse(module, args):
        raise RuntimeError('frame block 1 refused (test)')

    handle = model.aggregator.frame_blocks[1].register_forward_pre_hook(refuse)
    try:
        with pytest.raises(RuntimeError, match='frame block 1 refused'):
            _batch(model, images, states, ready, graphs)
    finally:
        handle.remove()
    assert [(s.kv.num_frames, s.kv.stats()) for s in states] == before


def _assert_close(got: list[list[dict]], want: list[list[dict]], atol: float,
                  rtol: float) -> None:
    for stream_got, stream_want in zip(got, want):
        assert len(stream_got) == len(stream_want)
        for a, b in zip(stream_got, stream_want):
            for key in KEYS:
                torch.testing.assert_close(a[key], b[key], atol=atol, rtol=rtol)
    # Not a constant: the frames differ, so the poses must move.
    poses = torch.cat([o['pose_enc'] for o in got[0]])
    assert (poses[1:] - poses[:-1]).abs().max() > 1e-4


def _images(count: int, streams: int, device: str = 'cpu',
            dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    return [random_images(count, gen, device=device, dtype=dtype) for _ in range(streams)]


@pytest.mark.parametrize('streams', [2, 3])
def test_whole_batches_equal_each_stream_alone_on_cpu(streams):
    # 12 frames: every stream fills its window and slides it (evictions) inside batches.
    model = tiny_model('cpu', torch.float32)
    images = _images(12, streams)
    graphs = BatchGraphs(False, staged=True)
    got, batches = _batched(model, images, graphs)
    want = [_alone(model, imgs) for imgs in images]
    # The batched GEMMs see B*P rows: float32 rounding of another blocking at most.
    _assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert batches >= 8 and graphs.whole.batches == batches and graphs.captured == 0


def test_a_failed_whole_batch_rolls_every_stream_back():
    model = tiny_model('cpu', torch.float32)
    images = _images(9, 3)
    graphs = BatchGraphs(False, staged=True)
    # Step 5: frames 6 (the keyframe that fills the window), 5 and 4 (a non-keyframe and a
    # keyframe mid-fill). A failed keyframe that evicts could not bring the evicted frame back
    # (StreamKV.end_frame), so the failure comes before any eviction.
    got, _ = _batched(model, images, graphs, fail_at=5)
    want = [_alone(model, imgs) for imgs in images]
    _assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the CPU refusal of a capture')
def test_a_failed_batch_capture_steps_down_and_the_frames_stay_right():
    # No CUDA: the whole-batch capture fails (counted), that batch runs eagerly over the
    # staged ranges, the next one tries segments (fails, counted) and runs them eagerly.
    state = FastPathState('whole_frame', compile=False)
    graphs = BatchGraphs(True, lambda exc: state.fall_back('batch_capture', exc), staged=True)
    model = tiny_model('cpu', torch.float32)
    images = _images(6, 2)
    got, batches = _batched(model, images, graphs)
    want = [_alone(model, imgs) for imgs in images]
    _assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert batches >= 3
    assert state.fallbacks()['batch_capture'] == 2
    assert not graphs.staged and not graphs.capture and graphs.whole_captured == 0
    assert 'batched frames' in state.mode.reason


def _cuda_runner(model) -> FrameRunner:
    runner = FrameRunner.for_model(model)
    runner.fast_path.request('whole_frame', False)
    return runner


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('streams', [2, 3])
def test_captured_batch_equals_each_streams_whole_frame_graphs_in_bf16(streams):
    # The batch graph runs the same staged kernels on B*P GEMM rows; each stream alone runs
    # its own whole-frame graphs: bf16 noise apart (as test_frame_graphs' whole frames).
    model = tiny_model('cuda', torch.bfloat16)
    images = _images(12, streams, 'cuda')
    state = FastPathState('whole_frame', compile=False)
    graphs = BatchGraphs(True, lambda exc: state.fall_back('batch_capture', exc), staged=True)
    got, batches = _batched(model, images, graphs)
    runner = _cuda_runner(model)
    want = [_alone(model, imgs, runner) for imgs in images]
    assert sum(state.fallbacks().values()) == 0, state.mode.reason
    assert sum(runner.fast_path.fallbacks().values()) == 0, runner.fast_path.mode.reason
    assert graphs.staged and graphs.whole_captured >= 1 and graphs.captured == 0
    assert graphs.whole.batches == batches
    _assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_batches_replay_once_their_graphs_are_captured():
    # 30 frames: after the fill every batch has one of a few staged keys per stream; once
    # each combination was captured the next 10 batches only replay.
    model = tiny_model('cuda', torch.bfloat16)
    images = _images(30, 2, 'cuda')
    state = FastPathState('whole_frame', compile=False)
    graphs = BatchGraphs(True, lambda exc: state.fall_back('batch_capture', exc), staged=True)
    counts: list[int] = []
    original = graphs.whole_for

    def counted(pool):
        whole = original(pool)
        counts.append(whole.captured)
        return whole

    graphs.whole_for = counted  # observes the graphs captured before each batch
    got, batches = _batched(model, images, graphs)
    counts.append(graphs.whole_captured)
    assert sum(state.fallbacks().values()) == 0, state.mode.reason
    assert batches == 27 and len(counts) == batches + 1 and counts[-1] >= 1
    assert counts[-11:] == [counts[-1]] * 11  # no capture during the last 10 batches
    assert graphs.whole.batches == batches


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_overlapped_batches_equal_serial_ones_in_bf16():
    # The slots' cache attentions (branches of the batch graph) and the streams' camera-head
    # replays on side streams: the same kernels as on one stream, so the same numbers.
    model = tiny_model('cuda', torch.bfloat16)
    images = _images(12, 3, 'cuda')
    runs = {}
    for overlap in (False, True):  # cache.kernel.lanes
        state = FastPathState('whole_frame', compile=False)
        graphs = BatchGraphs(True, lambda exc: state.fall_back('batch_capture', exc),
                             staged=True, lanes=overlap)
        runner = _cuda_runner(model)
        runs[overlap] = _batched(model, images, graphs, runner=runner)[0]
        assert sum(state.fallbacks().values()) == 0, state.mode.reason
        assert sum(runner.fast_path.fallbacks().values()) == 0, runner.fast_path.mode.reason
        assert graphs.whole_captured >= 1 and runner.head_step_built('camera head')
        # Side streams ran work (graph captures, head replays) only with the lanes on.
        assert (graphs.lanes.forks > 0) is overlap, graphs.lanes.forks
    _assert_close(runs[True], runs[False], atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('storage', ['bfloat16', 'float8_e4m3fn'])
def test_joint_fa3_batches_equal_slot_by_slot_ones(monkeypatch, storage):
    # Backend fa3 (parts): every slot's block written by one index_copy and attended by one
    # FA3 launch over all runs (staged_runs.py), against the same batches slot by slot on the
    # lanes: the same kernels per run, so the same numbers but for bf16 GEMM blocking.
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip('FA3 needs a Hopper GPU')
    pytest.importorskip('fa3_fwd_interface')
    model = tiny_model('cuda', torch.bfloat16)
    images = _images(12, 3, 'cuda')
    runs, joined = {}, {}
    for joint in (False, True):
        cache = dataclasses.replace(CACHE, backend='fa3', dtype=storage,
                                    kernel=KernelConfig(staged_runs=joint))
        state = FastPathState('whole_frame', compile=False)
        graphs = BatchGraphs(True, lambda exc: state.fall_back('batch_capture', exc),
                             staged=True)
        forks = []
        original = graphs.lanes.run

        def counted(*args, **kwargs):
            forks.append(1)
            return original(*args, **kwargs)

        monkeypatch.setattr(graphs.lanes, 'run', counted)
        runs[joint], batches = _batched(model, images, graphs, cache=cache)
        assert sum(state.fallbacks().values()) == 0, state.mode.reason
        assert graphs.whole_captured >= 1 and graphs.whole.batches == batches
        joined[joint] = len(forks)
    # Slot by slot, the lanes run every block's attentions (and the camera heads); joined,
    # only the camera heads: one call a batch.
    assert joined[True] < joined[False]
    _assert_close(runs[True], runs[False], atol=2e-2, rtol=2e-2)
