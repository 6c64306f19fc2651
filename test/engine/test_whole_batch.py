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
"""A batch of several streams' frames through ``Runner.run`` equals each stream alone.

On the CPU the batch runs eagerly: whole batches run the same segments and the same staged
writes and attentions, in the order the GPU captures them (``runner/whole_batch.py``); segment
batches the same segments with each stream's cache attention between them. On CUDA (marker
gpu) a whole batch is one captured graph, compared with each stream's own whole-frame graphs
(a frame alone is a batch of one).

Schedule (N_s 2, W 3, ``tiny_stream.CACHE``, K 2): stream b starts b steps after stream 0, so
a batch holds streams whose windows are filling beside full, sliding ones, and keyframes beside
non-keyframes (neighbouring streams are one frame apart). Each step is one ``Runner.run`` of
every stream's job: a scale pass runs alone, the streaming frames together.

Run: ``python -m pytest test/engine/test_whole_batch.py`` (tiny golden-weights model).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lingbot_map_ros.engine.cache import new_kv_pool, StreamKV
from lingbot_map_ros.engine.model.stream_state import StreamState
import lingbot_map_ros.engine.runner.batch_runs as batch_runs_module
from lingbot_map_ros.engine.runner.fast_path import FastPathState
from lingbot_map_ros.engine.runner.jobs import Job
from lingbot_map_ros.engine.runner.runner import Runner
from lingbot_map_ros.engine.runner.whole_batch import WholeBatches
from lingbot_map_ros.kernel_config import KernelConfig
import pytest
# tiny_engine and tiny_stream sit next to this file (pytest puts test/engine on sys.path).
from tiny_engine import random_images
from tiny_stream import CACHE, new_stream, run_job, tiny_model
import torch

N_S = CACHE.scale_frames
KEYS = ('pose_enc', 'pose_enc_iters', 'depth', 'depth_conf')
REFUSED = RuntimeError('operation not permitted when stream is capturing')
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


def _frame_job(state: StreamState, images: torch.Tensor, call: Call) -> Job:
    i, t, key = call
    return Job(state, images[i:i + 1], t, 'keyframe' if key else 'non-keyframe', with_depth=True)


def _alone(model, images: torch.Tensor, runner: Runner | None = None) -> list[dict]:
    """Each streaming frame of one stream, alone on a pool of its own (the reference)."""
    state = new_stream(model, _kv_dtype(model), images)
    run_job(model, runner, Job(state, images[:N_S], 0, 'scale', with_depth=True))
    return [run_job(model, runner, _frame_job(state, images, call))
            for call in _calls(images.shape[0])]


def _shared_streams(model, images: list[torch.Tensor], cache=CACHE) -> list[StreamState]:
    cache = replace(cache, streams=len(images))
    pool = new_kv_pool(model.config, cache, _kv_dtype(model), images[0].shape[-2:],
                       images[0].device)
    return [StreamState(model.new_camera_cache(), StreamKV.for_cache(pool, cache))
            for _ in images]


@dataclass
class Batched:
    """What :func:`_batched` ran."""

    outs: list[list[dict]]
    """Per stream its streaming frames' outputs."""
    batches: int = 0
    """Runs with two streaming frames or more."""
    groups: int = 0
    """Runs with at least one streaming frame (a lone frame is a batch of one)."""
    captured: list[int] = field(default_factory=list)
    """Whole-batch graphs captured after each batch of two or more (with whole batches)."""


def _batched(model, images: list[torch.Tensor], runner: Runner, fail_at: int = -1,
             cache=CACHE, offset: int = 1, together: bool = True) -> Batched:
    """Run the streams on one pool, every step's jobs as one ``Runner.run``.

    ``fail_at``: that step's batch first fails once in frame block 1 (after global block 0's
    cache writes); the rolled-back streams must then equal streams that never saw it.
    ``cache``: the pool's settings (backend, storage dtype). ``offset``: stream b starts
    ``b * offset`` steps after stream 0. ``together``: the streaming frames of a step share
    one batch (else each runs alone: the eager mode).
    """
    states = _shared_streams(model, images, cache)
    calls = [_calls(imgs.shape[0]) for imgs in images]
    run = Batched([[] for _ in images])
    failed = fail_at < 0
    for step in range(offset * (len(images) - 1) + 1 + max(len(c) for c in calls)):
        jobs: list[Job] = []
        streams: list[int] = []
        for b, state in enumerate(states):
            local = step - b * offset
            if local == 0:
                jobs.append(Job(state, images[b][:N_S], 0, 'scale', with_depth=True))
                streams.append(-1)
            elif 1 <= local <= len(calls[b]):
                jobs.append(_frame_job(state, images[b], calls[b][local - 1]))
                streams.append(b)
        if not jobs:
            continue
        frames = sum(b >= 0 for b in streams)
        if step == fail_at:
            _fail_once(model, runner, states, jobs)
            failed = True
        for b, (out, size) in zip(streams, runner.run(jobs)):
            if isinstance(out, Exception):
                raise out
            assert size == (frames if together and b >= 0 else 1)
            if b >= 0:
                run.outs[b].append(out)
        run.groups += frames > 0
        if frames >= 2:
            run.batches += 1
            whole = runner.batches.whole
            if whole is not None:
                run.captured.append(whole.captured)
    assert failed, 'the failing step ran no batch'
    return run


def _fail_once(model, runner: Runner, states: list[StreamState], jobs: list[Job]) -> None:
    """Run the batch with frame block 1 raising; every stream must be as it was."""
    keyframes = [job.mode == 'keyframe' for job in jobs]
    assert len(jobs) == len(states) and any(keyframes) and not all(keyframes)
    assert all(job.mode != 'scale' for job in jobs)
    before = [(s.kv.num_frames, s.kv.stats(), s.camera.num_frames) for s in states]

    def refuse(module, args):
        raise RuntimeError('frame block 1 refused (test)')

    handle = model.aggregator.frame_blocks[1].register_forward_pre_hook(refuse)
    try:
        results = runner.run(jobs)
    finally:
        handle.remove()
    for out, size in results:  # every job of the batch gets the batch's error
        assert isinstance(out, RuntimeError) and 'frame block 1 refused' in str(out)
        assert size == len(jobs)
    assert [(s.kv.num_frames, s.kv.stats(), s.camera.num_frames) for s in states] == before


def _assert_close(got: list[list[dict]], want: list[list[dict]], atol: float,
                  rtol: float) -> None:
    assert len(got) == len(want)
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


def _no_fallback(runner: Runner) -> None:
    fast = runner.fast_path
    assert sum(fast.fallbacks().values()) == 0, fast.mode.reason


@pytest.mark.parametrize('mode', ['whole_frame', 'segments'])
@pytest.mark.parametrize('streams', [2, 3])
def test_batches_equal_each_stream_alone_on_cpu(streams, mode):
    # 12 frames: every stream fills its window and slides it (evictions) inside batches.
    model = tiny_model('cpu', torch.float32)
    images = _images(12, streams)
    runner = Runner(model, FastPathState(mode))
    run = _batched(model, images, runner)
    want = [_alone(model, imgs) for imgs in images]
    # The batched GEMMs see B*P rows: float32 rounding of another blocking at most.
    _assert_close(run.outs, want, atol=1e-5, rtol=1e-5)
    _no_fallback(runner)
    assert runner.fast_path.mode.aggregator == mode
    assert run.batches >= 8 and runner.batches.captured == 0
    whole = runner.batches.whole
    if mode == 'whole_frame':
        # Every run with a streaming frame went whole, lone frames as batches of one.
        assert whole is not None and whole.batches == run.groups and whole.captured == 0
    else:
        assert whole is None


@pytest.mark.parametrize('mode', ['whole_frame', 'segments'])
def test_a_failed_batch_rolls_every_stream_back(mode):
    model = tiny_model('cpu', torch.float32)
    images = _images(9, 3)
    runner = Runner(model, FastPathState(mode))
    # Step 5: frames 6 (the keyframe that fills the window), 5 and 4 (a non-keyframe and a
    # keyframe mid-fill). A failed keyframe that evicts could not bring the evicted frame back
    # (StreamKV.end_frame), so the failure comes before any eviction.
    run = _batched(model, images, runner, fail_at=5)
    want = [_alone(model, imgs) for imgs in images]
    _assert_close(run.outs, want, atol=1e-5, rtol=1e-5)
    _no_fallback(runner)  # a failing batch is its jobs' error, not a step-down


def test_a_refused_job_leaves_the_others_going_and_its_stream_unchanged():
    model = tiny_model('cpu', torch.float32)
    images = _images(3, 3)
    runner = Runner(model, FastPathState('whole_frame'))
    states = _shared_streams(model, images)
    scale = runner.run([Job(s, imgs[:N_S], 0, 'scale', with_depth=True)
                        for s, imgs in zip(states, images)])
    assert all(not isinstance(out, Exception) and size == 1 for out, size in scale)
    (call,) = _calls(3)
    before = (states[1].kv.stats(), states[1].camera.num_frames)
    jobs = [_frame_job(s, imgs, call) for s, imgs in zip(states, images)]
    jobs[1] = replace(jobs[1], time_index=-1)  # refused by Aggregator.prepare
    results = runner.run(jobs)
    refused, size = results[1]
    assert isinstance(refused, ValueError) and 'time_index=-1' in str(refused) and size == 1
    assert (states[1].kv.stats(), states[1].camera.num_frames) == before
    assert [size for _, size in (results[0], results[2])] == [2, 2]
    # The refused stream goes on with its right job, alone.
    ((late, size),) = runner.run([_frame_job(states[1], images[1], call)])
    assert size == 1 and not isinstance(late, Exception)
    # One list of the three streams' frames: their poses differ (the check's last step).
    want = [_alone(model, imgs)[0] for imgs in images]
    _assert_close([[results[0][0], late, results[2][0]]], [want], atol=1e-5, rtol=1e-5)


def test_a_stream_twice_in_one_run_is_refused_before_anything_runs():
    model = tiny_model('cpu', torch.float32)
    images = _images(3, 1)
    runner = Runner(model, FastPathState('whole_frame'))
    (state,) = _shared_streams(model, images)
    job = Job(state, images[0][:N_S], 0, 'scale')
    with pytest.raises(ValueError, match='appears twice'):
        runner.run([job, job])
    assert state.kv.num_frames == 0 and state.camera.num_frames == 0


def test_after_a_capture_step_down_batches_run_uncaptured_segments():
    # The mode 'eager': a batch of one is the model's eager forward, several streams' frames
    # still one batch, its segments run as they are (no whole batch, nothing captured).
    model = tiny_model('cpu', torch.float32)
    images = _images(6, 2)
    runner = Runner(model, FastPathState('whole_frame'))
    runner.fast_path.fall_back('capture', REFUSED)
    run = _batched(model, images, runner)
    _assert_close(run.outs, [_alone(model, imgs) for imgs in images], atol=1e-5, rtol=1e-5)
    assert runner.fast_path.mode.aggregator == 'eager' and run.batches >= 3
    assert runner.batches.whole is None and runner.batches.captured == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the CPU refusal of a capture')
def test_a_failed_batch_capture_steps_down_and_the_frames_stay_right(monkeypatch):
    # No CUDA: the whole-batch capture fails (counted), that batch runs eagerly over the
    # staged ranges, the next ones go through the segments (eagerly: nothing to capture).
    class CapturingBatches(WholeBatches):
        def __init__(self, pool, _capture, compile_merge=False):
            super().__init__(pool, True, compile_merge)

    monkeypatch.setattr(batch_runs_module, 'WholeBatches', CapturingBatches)
    model = tiny_model('cpu', torch.float32)
    images = _images(6, 2)
    runner = Runner(model, FastPathState('whole_frame'))
    # Streams side by side from the start: the first capture is of a batch of two.
    run = _batched(model, images, runner, offset=0)
    _assert_close(run.outs, [_alone(model, imgs) for imgs in images], atol=1e-5, rtol=1e-5)
    assert run.batches == run.groups == 4
    fast = runner.fast_path
    assert {kind: n for kind, n in fast.fallbacks().items() if n} == {'whole_frame': 1}
    assert fast.mode.aggregator == 'segments' and 'segment by segment' in fast.mode.reason
    whole = runner.batches.whole
    assert whole.batches == 1 and whole.captured == 0 and runner.batches.captured == 0


def _cuda_runner(model, lanes: bool = True) -> Runner:
    return Runner(model, FastPathState('whole_frame'), lanes=lanes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('streams', [2, 3])
def test_captured_batch_equals_each_streams_whole_frame_graphs_in_bf16(streams):
    # The batch graph runs the same staged kernels on B*P GEMM rows; each stream alone runs
    # its own whole-frame graphs: bf16 noise apart (as test_frame_graphs' whole frames).
    model = tiny_model('cuda', torch.bfloat16)
    images = _images(12, streams, 'cuda')
    runner = _cuda_runner(model)
    run = _batched(model, images, runner)
    alone = _cuda_runner(model)
    want = [_alone(model, imgs, alone) for imgs in images]
    _no_fallback(runner)
    _no_fallback(alone)
    whole = runner.batches.whole
    assert whole.captured >= 1 and runner.batches.captured == 0
    assert whole.batches == run.groups
    assert any(key.shape[0] == streams for key in whole.keys)  # a batch of all of them
    _assert_close(run.outs, want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_batches_replay_once_their_graphs_are_captured():
    # 30 frames: after the fill every batch has one of a few staged keys per stream; once
    # each combination was captured the last 10 batches only replay.
    model = tiny_model('cuda', torch.bfloat16)
    images = _images(30, 2, 'cuda')
    runner = _cuda_runner(model)
    run = _batched(model, images, runner)
    _no_fallback(runner)
    assert run.batches == 27 and len(run.captured) == run.batches and run.captured[-1] >= 1
    assert run.captured[-11:] == [run.captured[-1]] * 11  # no capture in the last 10 batches
    assert runner.batches.whole.batches == run.groups


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_overlapped_batches_equal_serial_ones_in_bf16():
    # The slots' cache attentions (branches of the batch graph) and the streams' camera-head
    # replays on side streams: the same kernels as on one stream, so the same numbers.
    model = tiny_model('cuda', torch.bfloat16)
    images = _images(12, 3, 'cuda')
    runs = {}
    for overlap in (False, True):  # cache.kernel.lanes
        runner = _cuda_runner(model, lanes=overlap)
        runs[overlap] = _batched(model, images, runner).outs
        _no_fallback(runner)
        assert runner.batches.whole.captured >= 1
        assert runner.heads.head_step_built('camera head')
        # Side streams ran work (graph captures, head replays) only with the lanes on.
        forks = runner.batches.lanes.forks
        assert (forks > 0) is overlap, forks
    _assert_close(runs[True], runs[False], atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('storage', ['bfloat16', 'float8_e4m3fn'])
def test_joint_fa3_batches_equal_slot_by_slot_ones(storage):
    # Backend fa3 (parts): every slot's block written by one index_copy and attended by one
    # FA3 launch over all runs (staged_runs.py), against the same batches slot by slot on the
    # lanes: the same kernels per run, so the same numbers but for bf16 GEMM blocking.
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip('FA3 needs a Hopper GPU')
    pytest.importorskip('fa3_fwd_interface')
    model = tiny_model('cuda', torch.bfloat16)
    images = _images(12, 3, 'cuda')
    runs, forks = {}, {}
    for joint in (False, True):
        # FA3's FP8 kernel rounds the queries: reachable only as the approximate precision.
        cache = replace(CACHE, backend='fa3', dtype=storage,
                        precision='faithful' if storage == 'bfloat16' else 'fast_approximate',
                        kernel=KernelConfig(staged_runs=joint))
        runner = _cuda_runner(model)
        run = _batched(model, images, runner, cache=cache)
        runs[joint] = run.outs
        _no_fallback(runner)
        whole = runner.batches.whole
        assert whole.captured >= 1 and whole.batches == run.groups
        forks[joint] = runner.batches.lanes.forks
    # Slot by slot, the lanes run every block's attentions (and the heads); joined, only the
    # heads (camera heads beside the depth head): one fork a batch.
    assert 0 < forks[True] < forks[False], forks
    _assert_close(runs[True], runs[False], atol=2e-2, rtol=2e-2)
