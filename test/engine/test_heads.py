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
"""Camera head and DPT depth head: golden parity (official sizes) and the camera K/V cache.

Golden: ../shared/golden/stream_A.* (found through ``test/conftest.py``) with golden weights v1,
salt 0. ``taps`` are exactly the heads' inputs for ``tap_frames`` [0, 1, 2, 11]; the camera head
is checked in 'scale' mode over frames 0, 1 and then as the first streaming frame (2). Only the
heads are built (about 250M parameters, ~1 GB), not the whole model.
Run: ``python -m pytest test/engine/test_heads.py``
"""

from __future__ import annotations

from collections.abc import Callable
import json
import math

from lingbot_map_ros.config import ModelConfig
from lingbot_map_ros.engine.errors import CacheStateError
from lingbot_map_ros.engine.model.golden_weights import golden_state_dict
from lingbot_map_ros.engine.model.heads.camera_head import CameraHead
from lingbot_map_ros.engine.model.heads.dpt_head import DPTHead, uv_embedding
from lingbot_map_ros.engine.runner.fast_path import FastPathState
from lingbot_map_ros.engine.runner.head_steps import HeadSteps
import pytest
from safetensors.torch import load_file
import torch
import torch.nn.functional as F


def _load_golden(module: torch.nn.Module, prefix: str, salt: int = 0,
                 expected_shapes: dict[str, list[int]] | None = None) -> None:
    """Fill ``module`` with golden weights named ``prefix + key``; check names and shapes."""
    shapes = {k: list(v.shape) for k, v in module.state_dict().items()}
    if expected_shapes is not None:
        assert shapes == expected_shapes
    weights = golden_state_dict({prefix + k: v for k, v in shapes.items()}, salt)
    module.load_state_dict({k[len(prefix):]: v for k, v in weights.items()}, strict=True)


@pytest.fixture(scope='module')
def official_shapes(shared_file) -> Callable[[str], dict[str, list[int]]]:
    keys = json.loads(shared_file('docs', 'state_dict_keys.json').read_text())['state_dict']
    return lambda prefix: {k[len(prefix):]: v for k, v in keys.items() if k.startswith(prefix)}


@pytest.fixture(scope='module')
def stream_a(shared_file) -> tuple[dict[str, torch.Tensor], dict]:
    return (load_file(shared_file('golden', 'stream_A.safetensors')),
            json.loads(shared_file('golden', 'stream_A.json').read_text()))


@pytest.fixture(scope='module')
def official_dpt(official_shapes) -> DPTHead:
    head = DPTHead.from_config(ModelConfig())
    _load_golden(head, 'depth_head.', expected_shapes=official_shapes('depth_head.'))
    return head.eval()


@pytest.fixture(scope='module')
def official_camera(official_shapes) -> CameraHead:
    head = CameraHead.from_config(ModelConfig())
    _load_golden(head, 'camera_head.', expected_shapes=official_shapes('camera_head.'))
    return head.eval()


def test_dpt_matches_golden(official_dpt: DPTHead, stream_a: tuple) -> None:
    ref, meta = stream_a
    height, width = meta['stream']['height'], meta['stream']['width']
    frames = ref['tap_frames']
    with torch.inference_mode():
        depth, conf = official_dpt(list(ref['taps'].unbind(1)), (height, width))
    assert depth.shape == conf.shape == (len(frames), height, width)
    assert depth.dtype == torch.float32
    for out, key in ((depth, 'depth'), (conf, 'depth_conf')):
        expected = ref[key][frames]
        rel = ((out.double() - expected).abs() / expected).max().item()
        assert rel <= meta['tolerances'][key]['rtol'], f'{key}: max rel error {rel}'


def test_camera_head_matches_golden(official_camera: CameraHead, stream_a: tuple) -> None:
    ref, meta = stream_a
    atol = meta['tolerances']['pose_enc_iters']['atol']
    num_scale = meta['stream']['num_scale_frames']
    frames = ref['tap_frames'].tolist()
    assert frames[:num_scale + 1] == list(range(num_scale + 1))
    camera = ref['taps'][:, -1, 0]  # layer 23, camera token: [4, 2048]
    expected = ref['pose_enc_iters']
    head = official_camera
    head.reset_cache()
    with torch.inference_mode():
        pose, iters = head(camera[:num_scale], 'scale')
        assert iters.shape == (num_scale, 4, 9) and torch.equal(pose, iters[:, -1])
        assert (iters.double() - expected[:num_scale]).abs().max() <= atol
        # First streaming frame: as a non-keyframe (nothing stored), then as a keyframe. Both
        # attend over the scale frames plus themselves, so both match the reference.
        step = camera[num_scale:num_scale + 1]
        for mode, cached in (('non-keyframe', num_scale), ('keyframe', num_scale + 1)):
            _, iters = head(step, mode)
            assert (iters[0].double() - expected[num_scale]).abs().max() <= atol
            assert head.cache_stats().num_frames == cached
    # Spec §9.3: 256 KiB of float32 K/V per cached frame.
    assert head.cache_stats().used_bytes == (num_scale + 1) * 256 * 1024
    head.reset_cache()
    assert head.cache_stats().allocated_bytes == 0


def test_camera_head_takes_full_tap(official_camera: CameraHead, stream_a: tuple) -> None:
    ref, _ = stream_a
    head = official_camera
    head.reset_cache()
    with torch.inference_mode():
        _, from_tap = head(ref['taps'][:2, -1], 'scale')
        head.reset_cache()
        _, from_slot = head(ref['taps'][:2, -1, 0], 'scale')
    head.reset_cache()
    # Same tokens, other buffers: equal up to BLAS round-off.
    assert torch.allclose(from_tap, from_slot, rtol=1e-5, atol=1e-6)


def _tiny_camera_head(dtype: torch.dtype = torch.float64) -> CameraHead:
    head = CameraHead.from_config(ModelConfig.from_preset('tiny'))
    _load_golden(head, 'camera_head.', salt=7)
    return head.to(dtype).eval()


def _naive_camera_iters(head: CameraHead, tokens: torch.Tensor, num_scale: int) -> torch.Tensor:
    """Recompute the head over an explicit token list with a mask instead of a cache.

    ``tokens`` = [scale frames, kept keyframes in order, current frame]. Token i may attend to
    token j iff j is a scale frame or j <= i: scale frames see each other, each keyframe saw the
    frames kept before it and itself, and the current (last) frame sees everything.
    """
    n = tokens.shape[0]
    idx = torch.arange(n)
    allowed = (idx[None, :] < num_scale) | (idx[None, :] <= idx[:, None])

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    c = head.token_norm(tokens)[None]
    pose, outputs = None, []
    for _ in range(head.num_iterations):
        cond = head.empty_pose_tokens.expand(1, n, 9) if pose is None else pose
        shift, scale, gate = head.poseLN_modulation(head.embed_pose(cond)).chunk(3, -1)
        x = gate * (F.layer_norm(c, c.shape[-1:], eps=1e-6) * (1 + scale) + shift) + c
        for block in head.trunk:
            x = block(x, attend=attend)
        delta = head.pose_branch(head.trunk_norm(x))
        pose = delta if pose is None else pose + delta
        outputs.append(torch.cat([pose[..., :7], pose[..., 7:].clamp_min(0)], -1))
    return torch.stack(outputs, 2)[0]


@pytest.mark.parametrize('fixed_shape', [False, True], ids=['growing', 'fixed-shape'])
def test_camera_cache_matches_naive_recomputation(fixed_shape: bool) -> None:
    # fixed-shape: the CUDA-graph path (slot as a tensor, masked attention over the whole
    # buffer), here run without capture; it must rebuild when the buffer grows (16 -> 32).
    torch.manual_seed(0)
    head = _tiny_camera_head()
    # The camera head as the runner runs it: its head steps (no aggregator or depth head).
    fast_path = FastPathState('whole_frame' if fixed_shape else 'eager')
    steps = HeadSteps(None, head, None, fast_path)  # type: ignore[arg-type]
    num_scale, num_stream = 3, 24
    tokens = torch.randn(num_scale + num_stream, 256, dtype=torch.float64)
    # Streaming roles: keyframes with non-keyframes in between, two keyframes in a row at the
    # end; 3 + 17 = 20 kept frames > 16 forces the buffer to grow once.
    roles = ['keyframe' if i % 3 != 1 or i > 20 else 'non-keyframe' for i in range(num_stream)]
    assert roles[-2:] == ['keyframe', 'keyframe']
    kept = list(range(num_scale))
    with torch.inference_mode():
        _, iters = steps.camera(tokens[:num_scale], 'scale')
        naive = _naive_camera_iters(head, tokens[:num_scale], num_scale)
        torch.testing.assert_close(iters, naive, rtol=0, atol=1e-12)
        for i, role in enumerate(roles, start=num_scale):
            _, iters = steps.camera(tokens[i:i + 1], role)
            naive = _naive_camera_iters(head, tokens[kept + [i]], num_scale)[-1:]
            torch.testing.assert_close(iters, naive, rtol=0, atol=1e-12)
            if role == 'keyframe':
                kept.append(i)
            assert head.cache_stats().num_frames == len(kept)
    stats = head.cache_stats()
    assert len(kept) == 20 and stats.capacity_frames == 32
    assert fast_path.mode.head_on('camera head') is fixed_shape
    assert sum(fast_path.fallbacks().values()) == 0
    assert steps.head_step_built('camera head') is fixed_shape
    if fixed_shape:  # rebuilt for the grown buffer
        assert steps.head_step_key('camera head', head.cache).cache_capacity == 32
    per_frame = head.num_iterations * len(head.trunk) * 2 * 256 * 8
    assert stats.used_bytes == 20 * per_frame and stats.allocated_bytes == 32 * per_frame
    # The last frame's result depends on its history (here: without the previous keyframe),
    # so the comparison above can fail.
    shorter = _naive_camera_iters(head, tokens[kept[:-2] + kept[-1:]], num_scale)[-1]
    assert (shorter - iters[0]).abs().max() > 1e-4


def test_fixed_shape_camera_attention_ignores_what_unused_slots_held(monkeypatch) -> None:
    # The fixed-shape path attends over every slot of the buffer, the unused ones masked. A
    # masked slot must not be able to poison the result (0 * NaN = NaN): freshly allocated
    # memory may hold any bit pattern, so an "empty" allocation is made to hold NaNs here.
    real_empty = torch.empty

    def garbage_empty(*size, **kwargs):
        out = real_empty(*size, **kwargs)
        return out.fill_(float('nan')) if out.is_floating_point() else out

    monkeypatch.setattr(torch, 'empty', garbage_empty)
    torch.manual_seed(0)
    head = _tiny_camera_head()
    tokens = torch.randn(6, 256, dtype=torch.float64)
    with torch.inference_mode():
        steps = HeadSteps(None, head, None, FastPathState('whole_frame'))  # type: ignore
        steps.camera(tokens[:3], 'scale')
        fixed = [steps.camera(tokens[i:i + 1], 'keyframe')[1] for i in range(3, 6)]
        assert steps.head_step_built('camera head')
        head.reset_cache()
        head(tokens[:3], 'scale')
        growing = [head(tokens[i:i + 1], 'keyframe')[1] for i in range(3, 6)]
    for a, b in zip(fixed, growing):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_camera_cache_reset_and_errors() -> None:
    head = _tiny_camera_head()
    tokens = torch.randn(3, 256, dtype=torch.float64)
    with torch.inference_mode():
        _, first = head(tokens[:2], 'scale')
        with pytest.raises(CacheStateError, match='holds 2 frames'):
            head(tokens[:2], 'scale')
        with pytest.raises(ValueError, match='one frame'):
            head(tokens[:2], 'keyframe')
        with pytest.raises(ValueError, match='mode'):
            head(tokens[:1], 'keyframes')  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r'\[S, 256\]'):
            head(tokens[:, :128], 'keyframe')
        head(tokens[2:], 'keyframe')
        head.reset_cache(keep_memory=True)
        assert head.cache_stats().num_frames == 0 and head.cache_stats().capacity_frames == 16
        _, again = head(tokens[:2], 'scale')
    assert torch.allclose(first, again, rtol=1e-5, atol=1e-6)


def test_heads_ignore_caller_autocast() -> None:
    torch.manual_seed(1)
    camera = _tiny_camera_head(torch.float32)
    dpt = DPTHead.from_config(ModelConfig.from_preset('tiny'))
    _load_golden(dpt, 'depth_head.', salt=7)
    taps = [torch.randn(2, 6 + 2 * 3, 256) for _ in range(4)]
    with torch.inference_mode():
        plain = camera(taps[3], 'scale'), dpt(taps, (28, 42))
        camera.reset_cache()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            mixed = camera(taps[3], 'scale'), dpt(taps, (28, 42))
    for a, b in zip(plain, mixed):
        for x, y in zip(a, b):
            # bfloat16 would differ by ~1e-2; the tolerance only absorbs BLAS round-off.
            assert x.dtype == torch.float32 and torch.allclose(x, y, rtol=1e-5, atol=1e-6)


def test_dpt_chunking_and_input_checks() -> None:
    torch.manual_seed(2)
    dpt = DPTHead.from_config(ModelConfig.from_preset('tiny'))
    _load_golden(dpt, 'depth_head.', salt=3)
    dpt = dpt.double().eval()
    taps = [torch.randn(5, 6 + 3 * 2, 256, dtype=torch.float64) for _ in range(4)]
    with torch.inference_mode():
        depth, conf = dpt(taps, (42, 28))
        one_by_one = dpt(taps, (42, 28), frames_chunk_size=1)
    assert depth.shape == (5, 42, 28) and (depth > 0).all() and (conf > 1).all()
    torch.testing.assert_close(one_by_one, (depth, conf), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match='multiples of patch_size'):
        dpt(taps, (40, 28))
    with pytest.raises(ValueError, match=r'\[S, 14, 256\]'):
        dpt(taps, (28, 56))  # 2 x 4 patches need P = 14 tokens, the taps have 12
    with pytest.raises(ValueError, match='4 taps'):
        dpt(taps[:3], (42, 28))


def test_uv_embedding_values() -> None:
    channels, height, width, aspect = 8, 3, 4, 2.0
    emb = uv_embedding(channels, height, width, aspect)
    assert emb.shape == (8, 3, 4) and emb.dtype == torch.float32
    diag = math.sqrt(aspect ** 2 + 1)
    u0 = -aspect / diag * (width - 1) / width  # first column
    v2 = 1 / diag * (height - 1) / height  # last row
    omega1 = 100.0 ** -0.5  # k = 1 of channels / 4 = 2 frequencies
    assert emb[0, 1, 0].item() == pytest.approx(0.1 * math.sin(u0), abs=1e-8)
    assert emb[3, 1, 0].item() == pytest.approx(0.1 * math.cos(u0 * omega1), abs=1e-8)
    assert emb[5, 2, 3].item() == pytest.approx(0.1 * math.sin(v2 * omega1), abs=1e-8)
    assert emb[6, 2, 1].item() == pytest.approx(0.1 * math.cos(v2), abs=1e-8)
    # u is constant down a column, v along a row.
    assert torch.equal(emb[:4, 0], emb[:4, 2]) and torch.equal(emb[4:, :, 0], emb[4:, :, 3])
