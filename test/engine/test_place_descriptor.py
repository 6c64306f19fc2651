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
"""Place descriptors of keyframes (``model/place_descriptor.py``) through the session.

Tiny random-weight model on the CPU, the synthetic room (``tools/synthetic_scene.py``); the
GPU test compares the whole-frame fast path with eager frames.

Run: ``python -m pytest test/engine/test_place_descriptor.py`` (about 10 s on 2 cores).
"""

from __future__ import annotations

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.cameras.camera_batch import BatchStats, feed_batch
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.model.place_descriptor import place_descriptor
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.stream_feeder import StreamFeeder
from lingbot_map_ros.tools.synthetic_scene import render_sequence, SceneConfig
import numpy as np
import pytest
from tiny_engine import random_frames, tiny_config
import torch

N_S = 2
NUM_FRAMES = 12


def _config(**overrides) -> EngineConfig:
    return tiny_config({'cache.scale_frames': N_S, 'cache.sliding_window': 4,
                        'stream.keyframe_interval': 2, 'cache.streams': 2}, overrides)


def _run(session: StreamingSession, images) -> list:
    preds = []
    for i, image in enumerate(images):
        preds.extend(session.step(image, tag=1_000 + i))
    return preds


@pytest.fixture(scope='module')
def room() -> np.ndarray:
    """Render a loop around the synthetic room: the last frames come back to the first."""
    return render_sequence(SceneConfig(width=112, height=84, num_frames=NUM_FRAMES)).images


@pytest.fixture(scope='module')
def runs(room):
    """Run the same frames with descriptors off and on (one engine: the same weights)."""
    engine = Engine.load(_config(), allow_random_weights=True)
    off = _run(StreamingSession(_config(), engine=engine), room)
    on = _run(StreamingSession(_config(), engine=engine, place_descriptors=True), room)
    return off, on


def test_pooling_is_unit_norm_and_ignores_token_order_and_norms():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randn(3, 20, 16, generator=gen)
    out = place_descriptor(tokens)
    assert out.shape == (3, 16) and out.dtype == torch.float32
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(3))
    # A bag of unit tokens: permuting the patches or rescaling one changes nothing.
    shuffled = tokens[:, torch.randperm(20, generator=gen)]
    shuffled[:, 0] *= 50.0
    torch.testing.assert_close(place_descriptor(shuffled), out, atol=1e-6, rtol=0)
    # The pooled mean, square-rooted with its sign, then normalised (module docstring).
    mean = (tokens / tokens.norm(dim=-1, keepdim=True)).mean(dim=1)
    root = mean.sign() * mean.abs().sqrt()
    torch.testing.assert_close(out, root / root.norm(dim=-1, keepdim=True))
    # bf16 tokens (the GPU path) give a float32 descriptor close to the float32 one.
    half = place_descriptor(tokens.to(torch.bfloat16))
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, out, atol=0.02, rtol=0)


@pytest.mark.parametrize('bad', [torch.zeros(4, 8), torch.zeros(1, 0, 8),
                                 torch.zeros(1, 3, 8, dtype=torch.long)])
def test_pooling_refuses_bad_tokens(bad):
    with pytest.raises(ValueError, match='place_descriptor'):
        place_descriptor(bad)


def test_only_keyframes_carry_a_unit_descriptor(runs):
    _, on = runs
    assert [p.role for p in on][:N_S + 2] == ['scale'] * N_S + ['keyframe', 'non-keyframe']
    for pred in on:
        if pred.role == 'non-keyframe':
            assert pred.descriptor is None
            continue
        assert pred.descriptor.shape == (128,) and pred.descriptor.dtype == np.float32
        assert np.linalg.norm(pred.descriptor) == pytest.approx(1.0, abs=1e-5)


def test_descriptors_off_leave_nothing_and_change_no_output(runs):
    off, on = runs
    assert all(p.descriptor is None for p in off)
    assert len(off) == len(on) == NUM_FRAMES
    for a, b in zip(off, on):
        # The same computation on the same machine: the poses are bitwise equal.
        np.testing.assert_array_equal(a.pose_enc, b.pose_enc)
        np.testing.assert_array_equal(a.c2w, b.c2w)


def test_same_frame_same_descriptor_wherever_it_runs(room, runs):
    _, on = runs
    # Frame 4 was a streaming keyframe; here it is a scale frame of a new session.
    session = StreamingSession(_config(), allow_random_weights=True, place_descriptors=True)
    again = _run(session, [room[4], room[5]])
    np.testing.assert_allclose(again[0].descriptor, on[4].descriptor, atol=1e-5)


def test_neighbours_score_higher_than_far_places_and_other_scenes(runs):
    _, on = runs
    keyframes = [p for p in on if p.descriptor is not None]
    desc = np.stack([p.descriptor for p in keyframes])
    index = [p.frame_index for p in keyframes]
    sim = desc @ desc.T
    neighbours = np.diag(sim, 1)
    # Halfway round the loop is the farthest place from the start; the loop's end is near it.
    halfway = index.index(NUM_FRAMES // 2)
    assert sim[0, halfway] < neighbours.min()
    assert sim[0, -1] > sim[0, halfway] + 0.1
    # Another scene: random-noise images share no structure with the room.
    noise = random_frames(4, seed=5, size=(84, 112))
    session = StreamingSession(_config(), allow_random_weights=True, place_descriptors=True)
    other = np.stack([p.descriptor for p in _run(session, noise) if p.descriptor is not None])
    assert (desc @ other.T).max() < neighbours.min()


def test_batched_frames_give_the_descriptors_of_single_frames(room, runs):
    _, on = runs
    engine = Engine.load(_config(), allow_random_weights=True)
    cameras = [StreamFeeder(StreamingSession(_config(), engine=engine, place_descriptors=want))
               for want in (True, False)]
    preds = [[], []]
    stats = BatchStats()
    for i, image in enumerate(room[:N_S + 3]):
        for k, result in enumerate(feed_batch(cameras, [image] * 2, [1_000 + i] * 2, stats)):
            assert result.accepted and result.drop is None and not result.resets
            preds[k].extend(result.predictions)
    assert stats.batches == 3  # the frames after the scale phase ran batched
    with_desc, without = preds
    assert all(p.descriptor is None for p in without)
    for pred in with_desc:
        if pred.role == 'non-keyframe':
            assert pred.descriptor is None
        else:
            np.testing.assert_allclose(pred.descriptor, on[pred.frame_index].descriptor,
                                       atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_whole_frame_graphs_give_the_eager_descriptors(room):
    """The pooling runs after the captured frame: graphs and eager frames agree (bf16)."""
    descriptors = []
    for fast_path in ('eager', 'whole_frame'):
        config = _config(**{'stream.device': 'cuda', 'stream.fast_path': fast_path})
        session = StreamingSession(config, allow_random_weights=True, place_descriptors=True)
        preds = _run(session, room[:N_S + 5])
        assert session.stats().fast_path == fast_path
        descriptors.append(np.stack([p.descriptor for p in preds if p.descriptor is not None]))
    np.testing.assert_allclose(descriptors[1], descriptors[0], atol=2e-2)
