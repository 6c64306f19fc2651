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
"""Phase 1 (the scale pass) runs the depth head one frame at a time, with unchanged outputs.

The DPT head over N_s frames at once was the session's memory peak (docs/gpu_memory.md); it
now runs in chunks of ``DPTHead.frames_chunk_size`` (default 1). The camera head is not
chunked: in the scale pass its N_s tokens attend to each other (chunks would change the
result), and its activations are N_s tokens of 2C channels, a few hundred kB. A rollover's
scale pass without depth keeps of the taps only what the camera head reads. The scale pass is
a job of the runner (a fast path asked for: a scale job still runs alone on the eager forward).
"""

from lingbot_map_ros.config import CacheConfig
from lingbot_map_ros.engine.cache import new_kv_pool, StreamKV
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.stream_state import StreamState
from lingbot_map_ros.engine.runner.fast_path import FastPathState
from lingbot_map_ros.engine.runner.jobs import Job
from lingbot_map_ros.engine.runner.runner import Runner
import pytest
# tiny_engine and tiny_stream sit next to this file (pytest puts test/engine on sys.path).
from tiny_engine import random_images
from tiny_stream import run_job, tiny_model
import torch

SCALE_FRAMES = 4
IMAGE_HW = (56, 84)


@pytest.fixture(scope='module')
def model() -> LingbotMapModel:
    return tiny_model('cpu', torch.float32, salt=11)


def _scale_pass(model: LingbotMapModel, chunk: int) -> dict:
    cache = CacheConfig(backend='sdpa', scale_frames=SCALE_FRAMES, sliding_window=2)
    pool = new_kv_pool(model.config, cache, torch.float32, IMAGE_HW, 'cpu')
    kv = StreamKV(pool, cache.scale_frames, cache.sliding_window, cache.max_total_frames)
    stream = StreamState(model.new_camera_cache(), kv)
    model.depth_head.frames_chunk_size = chunk
    images = random_images(SCALE_FRAMES, seed=3, hw=IMAGE_HW)
    runner = Runner(model, FastPathState('whole_frame'))
    try:
        return run_job(model, runner, Job(stream, images, 0, 'scale', with_depth=True,
                                          return_taps=True))
    finally:
        model.depth_head.frames_chunk_size = 1


def test_the_depth_head_runs_one_frame_at_a_time_by_default(model):
    assert model.depth_head.frames_chunk_size == 1


def test_phase_one_depth_is_each_frames_own_head_output_bit_for_bit(model):
    out = _scale_pass(model, chunk=1)
    assert out['depth'].shape == (SCALE_FRAMES, *IMAGE_HW)
    for i in range(SCALE_FRAMES):
        alone = model.depth_head([t[i:i + 1] for t in out['taps']], IMAGE_HW)
        assert torch.equal(out['depth'][i:i + 1], alone[0])
        assert torch.equal(out['depth_conf'][i:i + 1], alone[1])


def test_chunked_phase_one_equals_the_unchunked_pass(model):
    chunked, whole = _scale_pass(model, chunk=1), _scale_pass(model, chunk=SCALE_FRAMES)
    # The aggregator and the camera head do not depend on the depth head's chunking at all.
    for key in ('pose_enc', 'pose_enc_iters'):
        assert torch.equal(chunked[key], whole[key])
    for a, b in zip(chunked['taps'], whole['taps']):
        assert torch.equal(a, b)
    # The depth head computes each frame the same way in any chunking; CPU oneDNN/BLAS pick
    # their kernels by batch size, so the last bit may differ (1 frame vs N_s at once).
    for key in ('depth', 'depth_conf'):
        torch.testing.assert_close(chunked[key], whole[key], rtol=1e-5, atol=0)


def _block_steps(model: LingbotMapModel, camera_only: bool) -> tuple[object, int]:
    """Run the aggregator's resumable layer loop of a scale pass; return its output, pauses."""
    cache = CacheConfig(backend='sdpa', scale_frames=SCALE_FRAMES, sliding_window=2)
    pool = new_kv_pool(model.config, cache, torch.float32, IMAGE_HW, 'cpu')
    kv = StreamKV(pool, cache.scale_frames, cache.sliding_window, cache.max_total_frames)
    images = random_images(SCALE_FRAMES, seed=5, hw=IMAGE_HW)
    agg = model.aggregator
    with torch.no_grad():
        patch_hw = agg.prepare(images, 0, 'scale', kv)
        plan = kv.plan_frame('scale', SCALE_FRAMES)
        steps = agg.block_steps(agg.patch_embed(agg.normalize(images)), 0, 'scale', patch_hw,
                                kv, plan, camera_only=camera_only)
        pauses = 0
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value, pauses
            pauses += 1


def test_a_scale_pass_without_depth_keeps_only_the_camera_tokens_of_the_last_tap(model):
    camera, pauses = _block_steps(model, camera_only=True)
    full, _ = _block_steps(model, camera_only=False)
    assert pauses == model.config.depth
    assert len(full.taps) == len(model.config.tap_layers)
    channels = 2 * model.config.embed_dim
    assert [tuple(t.shape) for t in camera.taps] == [(SCALE_FRAMES, 1, channels)]
    # The same layer loop: the camera tokens the camera head reads are the full pass's.
    torch.testing.assert_close(camera.taps[0], full.taps[-1][:, :1], rtol=1e-6, atol=1e-6)
    head = model.camera_head
    poses = []
    for taps in (camera.taps, full.taps):
        head.reset_cache()
        with torch.no_grad():
            poses.append(head(taps[-1][:, 0], 'scale')[0])
    torch.testing.assert_close(poses[0], poses[1], rtol=1e-6, atol=1e-6)
