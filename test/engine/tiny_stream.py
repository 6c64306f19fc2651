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
"""A tiny golden-weights model streamed through a ``FrameRunner``: the fast-path tests' driver.

N_s 2, W 3, K 2 (``CACHE``, backend ``sdpa``): even frames after the scale pass are keyframes,
and with 9 frames the window is full from frame 6 on, so a stream crosses the window fill.
"""

from __future__ import annotations

from lingbot_map_ros.config import CacheConfig, ModelConfig
from lingbot_map_ros.engine.cache import new_kv_pool, StreamKV
from lingbot_map_ros.engine.model.frame_runner import FrameRunner
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.golden_weights import golden_state_dict
from lingbot_map_ros.engine.model.stream_state import StreamState
from lingbot_map_ros.engine.model.weights import load_weights
import torch

CACHE = CacheConfig(backend='sdpa', scale_frames=2, sliding_window=3)


def tiny_model(device: str, dtype: torch.dtype, salt: int = 3) -> LingbotMapModel:
    """Return the tiny preset with golden weights of ``salt``, aggregator in ``dtype``."""
    model = LingbotMapModel(ModelConfig.from_preset('tiny'))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    load_weights(model, golden_state_dict(shapes, salt=salt))
    model = model.to(device).eval()
    if dtype != torch.float32:
        model.cast_aggregator(dtype)
    return model


def new_stream(model: LingbotMapModel, kv_dtype: torch.dtype,
               images: torch.Tensor) -> StreamState:
    """Return a stream on a pool of its own for frames shaped like ``images``."""
    pool = new_kv_pool(model.config, CACHE, kv_dtype, images.shape[-2:], images.device)
    kv = StreamKV(pool, CACHE.scale_frames, CACHE.sliding_window, CACHE.max_total_frames)
    return StreamState(model.new_camera_cache(), kv)


def run_stream(model: LingbotMapModel, images: torch.Tensor, runner: FrameRunner,
               kv_dtype: torch.dtype) -> list[dict]:
    """Run ``images`` (scale pass, then one frame per call) through ``runner`` on a new stream.

    Returns:
        The scale call's outputs, then each frame's (with depth, and taps for the frames).
    """
    state = new_stream(model, kv_dtype, images)
    num_scale = CACHE.scale_frames
    outs = [model.forward_scale(images[:num_scale], state, with_depth=True, runner=runner)]
    for i in range(num_scale, images.shape[0]):
        # K=2 after N_s=2: even frames are keyframes; the time index counts cached keyframes,
        # so a non-keyframe shares the next keyframe's index.
        outs.append(model.forward_frame(images[i:i + 1], 2 + (i - 1) // 2, i % 2 == 0, state,
                                        with_depth=True, return_taps=True, runner=runner))
    return outs
