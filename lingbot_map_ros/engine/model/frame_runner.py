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
"""FrameRunner: how a streaming frame runs (eager, segments or whole frames), heads included.

The aggregator (``aggregator.py``) and the heads are plain modules that know nothing about
graphs: the aggregator checks a call and runs the eager layer loop; the heads expose their
one-frame work as fixed-shape steps (``CameraHead.frame_step``, ``DPTHead.frame_step``). This
runner sits above them and builds the fast path: the segment runner of each resolution
(``graphed.py``) keyed by :class:`CaptureKey`, and the heads' captured steps keyed by
:class:`HeadKey`. The mode is not its own: it reads it from the :class:`FastPathState`
(``fast_path.py``) it is given and reports every step-down there. The engine
(``engine/engine.py``) builds one state and one runner for its model and pool; the model does
not build either. Every call brings its stream's KV cache, so the runner serves any number of
streams of the engine.

Modes (``FastPathMode.aggregator``: the mode asked for is an upper bound; the pool's backend
caps it and a step-down lowers it):

* ``eager``: the aggregator's own ``forward``, the heads' own ``forward``;
* ``segments``: the fixed-shape work between cache attentions replayed as CUDA graphs (or
  compiled, or both), the cache attention eager in between;
* ``whole_frame``: segments plus the backend's capturable attention over the staged cache
  (``cache/staged_frames.py``), one CUDA graph per kind of frame.

On the CPU nothing is captured: segments and whole frames run their steps directly (compiled
with ``compile``). ``compile`` is orthogonal to the mode: it ``torch.compile``s the fixed-shape
work of whichever fast path is in effect (with ``eager`` there is none).

The heads of a streaming frame replay their step as one CUDA graph each where the fast path
captures (the DPT head compiled first with ``compile``); a head whose step cannot be built runs
eagerly from then on, independently of the aggregator. The scale pass always runs eagerly (its
shapes are used once).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .aggregator import Aggregator, AggregatorOutput
from .captured import CapturedCall
from .fast_path import FastPathState
from .graphed import FrameGraphs
from .heads.camera_head import CameraHead
from .heads.dpt_head import DPTHead
from ..cache.kv_pool import KVPool
from ..cache.staged_frames import can_stage, StagedFrames
from ..cache.stream_kv import StreamKV
from ..errors import CacheStateError
from ..frames import Role
from ..profiling import step_range


@dataclass(frozen=True)
class CaptureKey:
    """What a built segment runner depends on; a new key builds a new runner."""

    shape: tuple[int, ...]
    device: torch.device
    kv_dtype: torch.dtype
    weight_dtype: torch.dtype
    weights_ptr: int
    """Storage of the aggregator's weights: moving the module re-allocates what graphs read."""
    capture: bool
    compiled: bool
    pool: object | None
    """The KV pool a whole-frame runner writes into (None for segments)."""


@dataclass(frozen=True)
class HeadKey:
    """What a head's captured step depends on; a new key builds a new step."""

    part: str
    """'camera head', 'depth head' or 'dino trunk' (``fast_path.HEADS``)."""
    shapes: tuple[tuple[int, ...], ...]
    """Shapes of the step's tensor inputs."""
    dtype: torch.dtype
    device: torch.device
    weight_dtype: torch.dtype
    weights_ptr: int
    """Storage of the head's weights: moving the module re-allocates what graphs read."""
    capture: bool
    compiled: bool
    image_hw: tuple[int, int] = (0, 0)
    """Processed image size (depth head)."""
    cache_capacity: int = 0
    """Frames of the camera-head cache buffer (it grows by reallocation)."""
    cache_generation: int = 0
    """Which allocation of that buffer the step reads (``CameraKVCache.generation``)."""
    cache: object | None = None
    """The stream's camera-head cache the step reads and writes (compared by identity)."""


class FrameRunner:
    """Runs a call's aggregator and heads, through the fast path where it is on and works."""

    def __init__(self, aggregator: Aggregator, camera_head: CameraHead,
                 depth_head: DPTHead | None = None,
                 fast_path: FastPathState | None = None) -> None:
        """Run through ``fast_path``'s mode (a new state, fast path off, when None)."""
        self._agg = aggregator
        self._camera = camera_head
        self._depth = depth_head
        self.fast_path = fast_path if fast_path is not None else FastPathState()
        """The mode in effect and the fallback counters (the engine's)."""
        self._head_steps: dict[tuple[str, int], tuple[HeadKey, CapturedCall]] = {}
        """Built head steps by (part, id of the stream's camera cache; 0 for the others)."""
        self.step_builds: Counter[str] = Counter()
        """Head steps built so far by part (each build captures: diagnostics and tests)."""
        self._pool: KVPool | None = None
        self._graphs: tuple[CaptureKey, FrameGraphs] | None = None

    @classmethod
    def for_model(cls, model: Any, fast_path: FastPathState | None = None) -> 'FrameRunner':
        """Return a runner over ``model``'s aggregator and heads."""
        return cls(model.aggregator, model.camera_head, model.depth_head, fast_path)

    def bind_pool(self, pool: KVPool | None) -> None:
        """Plan for ``pool`` (the engine's, once built): its backend caps the mode."""
        if pool is self._pool:
            return
        self._graphs = None  # graphs of another pool write into its storage
        self._pool = pool
        if pool is None:
            self.fast_path.bind(None, False)
            return
        self.fast_path.bind(pool.backend, can_stage(pool),
                            f"backend '{pool.backend_name}' with {pool.dtype} on "
                            f'{pool.device.type} runs segments only')

    def release_stream(self, camera_cache: object) -> None:
        """Drop the head steps captured against a closed stream's camera cache."""
        self._head_steps.pop(('camera head', id(camera_cache)), None)

    @property
    def graphs(self) -> FrameGraphs | None:
        """Return the segment runner built for the latest resolution, if any."""
        return None if self._graphs is None else self._graphs[1]

    def __call__(self, images: torch.Tensor, time_index: int, mode: Role,
                 kv: StreamKV) -> AggregatorOutput:
        """Run one call of the streaming schedule on stream ``kv`` (``Aggregator.forward``)."""
        agg = self._agg
        with step_range('aggregator'):
            with step_range('prepare'):
                patch_hw = agg.prepare(images, time_index, mode, kv)
            self.bind_pool(kv.pool)
            segmented = self.fast_path.mode.aggregator != 'eager'
            graphs = self._graphs_for(images, kv.pool) if mode != 'scale' and segmented else None
            if graphs is None:
                return agg.run(images, time_index, mode, patch_hw, kv)
            with step_range('frame graph'):
                return graphs.run(images, time_index, mode, kv)

    def _graphs_for(self, images: torch.Tensor, pool: KVPool) -> FrameGraphs | None:
        """Return the segment runner of this resolution, dtype, device and mode (built once).

        Returns None, after a 'capture' step-down to 'eager', when the runner cannot be built
        (e.g. a CUDA graph capture this PyTorch/driver refuses): frames then run eagerly,
        slower but right, instead of failing one after another. A failed ``torch.compile`` (no
        compiler, no Triton) steps down to uncompiled ('compile'), a backend that supplies no
        capturable attention to segments ('backend_refused'); the runner is then rebuilt.
        """
        agg, state = self._agg, self.fast_path
        compiled = state.mode.segments_compile
        capture = images.device.type == 'cuda'
        staged = state.mode.aggregator == 'whole_frame'
        key = CaptureKey(tuple(images.shape), images.device, pool.dtype,
                         agg.camera_token.dtype, agg.camera_token.data_ptr(), capture,
                         compiled, pool if staged else None)
        if self._graphs is not None and self._graphs[0] == key:
            return self._graphs[1]
        self._graphs = None  # release the old graphs' memory first
        try:
            staging = StagedFrames(pool, compiled) if staged else None
        except CacheStateError as exc:
            state.fall_back('backend_refused', exc)
            return self._graphs_for(images, pool)
        try:
            runner = FrameGraphs(agg, images, pool.dtype, capture, compiled, staging,
                                 state.fall_back)
        except Exception as exc:  # noqa: BLE001 - Inductor/Triton raise many kinds
            state.fall_back('compile' if compiled else 'capture', exc)
            return self._graphs_for(images, pool) if compiled else None
        self._graphs = (key, runner)
        return runner

    @torch.no_grad()
    def prepare_full_window(self, kv: StreamKV) -> None:
        """Capture the full-window frame graphs now (see ``FrameGraphs.prepare_full_window``).

        Writes placeholders into stream ``kv``'s pages: reset it before its next frame. Where
        the capture steps down, the segments are built now instead, not at the next frame.
        """
        if self._graphs is not None:
            graphs = self._graphs[1]
            graphs.prepare_full_window(kv)
            self._graphs_for(graphs.image, kv.pool)

    # ---- heads ---------------------------------------------------------------------------------

    def camera(self, tokens: torch.Tensor, mode: Role) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the camera head on a call's camera tokens (see ``CameraHead.forward``)."""
        with step_range('camera head'):
            return self._run_camera(tokens, mode)

    def _run_camera(self, tokens: torch.Tensor, mode: Role) -> tuple[torch.Tensor, torch.Tensor]:
        head = self._camera
        if mode == 'scale' or not self.fast_path.mode.head_on('camera head'):
            return head(tokens, mode)
        camera, slot = head.begin_frame(tokens, mode)
        weight = head.embed_pose.weight
        key = HeadKey('camera head', (tuple(camera.shape),), camera.dtype, camera.device,
                      weight.dtype, weight.data_ptr(), camera.is_cuda, False,
                      cache_capacity=head.cache.capacity,
                      cache_generation=head.cache.generation, cache=head.cache)

        def examples() -> list[torch.Tensor]:
            # The slot's static buffer: a 0-d tensor, made only when the step is built.
            return [camera, torch.full((), slot, dtype=torch.long, device=camera.device)]

        with torch.autocast(device_type=camera.device.type, enabled=False):
            step = self._head_step(key, head.frame_step, examples)
            if step is None:
                return head(tokens, mode)
            iters = step(camera, slot)[0]
        head.end_frame(mode, 1)
        return iters[:, -1], iters

    def depth(self, taps: Sequence[torch.Tensor],
              image_size_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the depth head on a call's taps (see ``DPTHead.forward``)."""
        with step_range('depth head'):
            return self._run_depth(taps, image_size_hw)

    def _run_depth(self, taps: Sequence[torch.Tensor],
                   image_size_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        head = self._depth
        if head is None:
            raise ValueError('depth requested but the model was built with enable_depth=False')
        fast = self.fast_path.mode
        if not fast.head_on('depth head'):
            return head(taps, image_size_hw)
        grid_hw = head.check_inputs(taps, image_size_hw)
        if taps[0].shape[0] != 1:
            return head(taps, image_size_hw)
        uv = head.uv_tables(grid_hw, image_size_hw, taps[0].device)
        weight = head.norm.weight
        key = HeadKey('depth head', tuple(tuple(t.shape) for t in taps), taps[0].dtype,
                      taps[0].device, weight.dtype, weight.data_ptr(),
                      taps[0].is_cuda, fast.heads_compile,
                      image_hw=tuple(image_size_hw))

        def step(*frame_taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return head.frame_step(frame_taps, grid_hw, image_size_hw, uv)

        with torch.autocast(device_type=taps[0].device.type, enabled=False):
            call = self._head_step(key, step, lambda: list(taps))
            if call is None:
                return head(taps, image_size_hw)
            depth, conf = call(*taps)
        return depth, conf

    def dino(self, images: torch.Tensor) -> torch.Tensor:
        """Return the DINO tokens of one frame ``[1, 3, H, W]`` (any other batch: eagerly).

        A rollover's preparation runs its scale frames' trunks one frame per served frame;
        eagerly each costs the host time of a few hundred launches, several times its GPU
        work and a large part of a frame (docs/performance.md, 'CUDA graphs'). Here it replays
        one captured step per image shape where the fast path captures.
        """
        agg = self._agg

        def trunk(x: torch.Tensor) -> tuple[torch.Tensor]:
            return (agg.patch_embed(agg.normalize(x)),)

        if images.shape[0] != 1 or not self.fast_path.mode.head_on('dino trunk'):
            return trunk(images)[0]
        weight = next(agg.patch_embed.parameters())
        key = HeadKey('dino trunk', (tuple(images.shape),), images.dtype, images.device,
                      weight.dtype, weight.data_ptr(), images.is_cuda, False)
        step = self._head_step(key, trunk, lambda: [images])
        return trunk(images)[0] if step is None else step(images)[0]

    def _head_step(self, key: HeadKey, fn: Callable[..., tuple[torch.Tensor, ...]],
                   example_inputs: Callable[[], Sequence[torch.Tensor]]) -> CapturedCall | None:
        """Return the head step of ``key``, built (compiled, captured) on first use.

        One step per head and stream (the camera head's reads the stream's cache). None when
        it cannot be built here: that head then runs eagerly (one fallback).
        """
        slot = (key.part, id(key.cache) if key.cache is not None else 0)
        held = self._head_steps.get(slot)
        if held is not None and held[0] == key:
            return held[1]
        self._head_steps.pop(slot, None)  # release the old graph's memory first
        try:
            call = CapturedCall(fn, example_inputs(), key.capture, key.compiled)
        except Exception as exc:  # noqa: BLE001 - capture/Inductor/Triton raise many kinds
            self.fast_path.fall_back(key.part.replace(' ', '_'), exc)
            return None
        self._head_steps[slot] = (key, call)
        self.step_builds[key.part] += 1
        return call

    def head_step_built(self, part: str) -> bool:
        """Whether head ``part`` has a built step, for any stream (tests and diagnostics)."""
        return any(built == part for built, _ in self._head_steps)

    def head_step_key(self, part: str, cache: object | None = None) -> HeadKey | None:
        """Return the key of head ``part``'s step built on ``cache`` (camera head), or None."""
        held = self._head_steps.get((part, id(cache) if cache is not None else 0))
        return None if held is None else held[0]
