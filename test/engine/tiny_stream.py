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
"""A tiny golden-weights model streamed through a ``Runner``: the fast-path tests' driver.

N_s 2, W 3, K 2 (``CACHE``, backend ``sdpa``): even frames after the scale pass are keyframes,
and with 9 frames the window is full from frame 6 on, so a stream crosses the window fill.
Every call is a job of its own (a streaming frame is a batch of one); ``runner=None`` is the
model's eager forward, the reference the fast paths are compared with.
"""

from __future__ import annotations

from lingbot_map_ros.config import CacheConfig, ModelConfig
from lingbot_map_ros.engine.cache import new_kv_pool, StreamKV
from lingbot_map_ros.engine.frames import Role
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.golden_weights import golden_state_dict
from lingbot_map_ros.engine.model.stream_state import StreamState
from lingbot_map_ros.engine.model.weights import load_weights
import lingbot_map_ros.engine.runner.batch_runs as batch_runs_module
import lingbot_map_ros.engine.runner.captured as captured_module
from lingbot_map_ros.engine.runner.jobs import Job
from lingbot_map_ros.engine.runner.runner import Runner
from lingbot_map_ros.engine.runner.whole_batch import WholeBatches
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


def role(index: int) -> Role:
    """Return the role of streaming frame ``index`` (K=2 after N_s=2: even ones are keyframes)."""
    return 'keyframe' if index % 2 == 0 else 'non-keyframe'


def time_index(index: int) -> int:
    """Return the time index of streaming frame ``index``: the keyframes cached before it.

    A non-keyframe shares the index the next keyframe will get.
    """
    return CACHE.scale_frames + (index - CACHE.scale_frames + 1) // 2


def run_job(model: LingbotMapModel, runner: Runner | None, job: Job) -> dict:
    """Run ``job`` alone: on ``runner`` (a batch of one: it must run alone), else eagerly.

    Raises:
        Exception: the error the runner gave the job.
    """
    if runner is None:
        with torch.no_grad():
            return model(job.images, job.time_index, job.mode, job.stream, job.with_depth,
                         job.return_taps, job.with_descriptor)
    ((out, batch_size),) = runner.run([job])
    if isinstance(out, Exception):
        raise out
    if batch_size != 1:
        raise AssertionError(f'a lone job ran in a batch of {batch_size}')
    return out


def run_stream(model: LingbotMapModel, images: torch.Tensor, runner: Runner | None,
               kv_dtype: torch.dtype, state: StreamState | None = None) -> list[dict]:
    """Run ``images`` (scale pass, then one job per frame) through ``runner`` on a stream.

    ``state``: the stream (a new one on a pool of its own when None).

    Returns:
        The scale call's outputs, then each frame's (with depth, and taps for the frames).
    """
    state = new_stream(model, kv_dtype, images) if state is None else state
    num_scale = CACHE.scale_frames
    outs = [run_job(model, runner, Job(state, images[:num_scale], 0, 'scale', with_depth=True))]
    for i in range(num_scale, images.shape[0]):
        outs.append(run_job(model, runner, Job(state, images[i:i + 1], time_index(i), role(i),
                                               with_depth=True, return_taps=True)))
    return outs


def stand_in_capture(monkeypatch, refuse_first: Exception | None = None) -> list:
    """Capture on the CPU: whole batches ask for graphs, a stand-in "captures" them.

    The stand-in runs the function (the warm-up's writes) and replays it by calling it again,
    which is what a graph replay does; with ``refuse_first`` the first capture raises it.
    Returns the list of functions asked to be captured.
    """
    calls: list = []

    def capture(fn, pool=None):
        calls.append(fn)
        if refuse_first is not None and len(calls) == 1:
            raise refuse_first
        outputs = fn()

        class Replay:
            def replay(self):
                for static, fresh in zip(outputs, fn()):
                    static.copy_(fresh)
        return Replay(), outputs

    class CapturingBatches(WholeBatches):
        def __init__(self, pool, _capture, compile_merge=False):
            super().__init__(pool, True, compile_merge)

    monkeypatch.setattr(captured_module, 'capture_graph', capture)
    monkeypatch.setattr(torch.cuda, 'graph_pool_handle', lambda: None)
    monkeypatch.setattr(batch_runs_module, 'WholeBatches', CapturingBatches)
    return calls
