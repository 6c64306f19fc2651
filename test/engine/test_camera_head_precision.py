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
"""The camera head with a bf16 trunk (``stream.camera_head_dtype: bfloat16``) on the CPU.

Run: ``python -m pytest test/engine/test_camera_head_precision.py`` (CPU, a few seconds).
"""

from lingbot_map_ros.config import ModelConfig, StreamConfig
from lingbot_map_ros.engine.errors import CacheStateError
from lingbot_map_ros.engine.model.golden_weights import fill_golden_weights
from lingbot_map_ros.engine.model.heads.camera_head import CameraHead
import pytest
import torch


def _heads():
    cfg = ModelConfig.from_preset('tiny')
    head = CameraHead.from_config(cfg).eval()
    fill_golden_weights(head, salt=3)
    fast = CameraHead.from_config(cfg).eval()
    fast.load_state_dict(head.state_dict())
    return head, fast.set_compute_dtype(torch.bfloat16), 2 * cfg.embed_dim


def _stream(head, tokens, fixed_shape):
    """Scale pass over 3 frames, then keyframe, non-keyframe, keyframe: the poses."""
    out = [head(tokens[:3], 'scale')[0]]
    for i, mode in zip(range(3, 6), ('keyframe', 'non-keyframe', 'keyframe')):
        if fixed_shape:
            camera, slot = head.begin_frame(tokens[i:i + 1], mode)
            with torch.autocast('cpu', enabled=False):
                (iters,) = head.frame_step(camera, torch.tensor(slot))
            head.end_frame(mode, 1)
            out.append(iters[:, -1])
        else:
            out.append(head(tokens[i:i + 1], mode)[0])
    return torch.cat(out)


@torch.inference_mode()
def test_bf16_trunk_stays_close_to_float32_and_keeps_float32_outputs():
    head, fast, dim = _heads()
    tokens = torch.randn(6, dim, generator=torch.Generator().manual_seed(0))
    ref = _stream(head, tokens, fixed_shape=False)
    got = _stream(fast, tokens, fixed_shape=False)
    assert got.dtype == torch.float32
    assert fast.compute_dtype == torch.bfloat16 and head.compute_dtype == torch.float32
    # What stays float32: the pose embedding, the pose branch, the LayerNorms.
    assert fast.embed_pose.weight.dtype == torch.float32
    assert fast.pose_branch.fc1.weight.dtype == torch.float32
    assert fast.token_norm.weight.dtype == torch.float32
    assert fast.cache_stats().num_frames == 5  # 3 scale frames + 2 keyframes
    rel = ((got - ref).norm() / ref.norm()).item()
    assert 0 < rel < 0.05


@torch.inference_mode()
def test_bf16_fixed_shape_step_matches_the_bf16_forward():
    _, fast, dim = _heads()
    tokens = torch.randn(6, dim, generator=torch.Generator().manual_seed(1))
    eager = _stream(fast, tokens, fixed_shape=False)
    fast.reset_cache()
    stepped = _stream(fast, tokens, fixed_shape=True)
    # Masked attention over the whole buffer vs over the cached frames: bf16 rounding apart.
    assert torch.allclose(stepped, eager, rtol=2e-2, atol=2e-2)


def test_set_compute_dtype_refuses_a_used_cache_and_non_float():
    head, _, dim = _heads()
    with torch.inference_mode():
        head(torch.randn(2, dim), 'scale')
    with pytest.raises(CacheStateError, match='reset it first'):
        head.set_compute_dtype(torch.bfloat16)
    head.reset_cache()
    with pytest.raises(ValueError, match='not a floating dtype'):
        head.set_compute_dtype(torch.int8)


def test_stream_config_checks_the_camera_head_dtype():
    assert StreamConfig().camera_head_dtype == 'bfloat16'  # the measured default
    assert StreamConfig(camera_head_dtype='float32').camera_head_dtype == 'float32'
    with pytest.raises(ValueError, match='camera_head_dtype'):
        StreamConfig(camera_head_dtype='float16')
