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
"""HeadSteps: the heads' one-frame work, and the DINO trunk's, as captured steps.

The heads (``model/heads``) are plain modules that expose their streaming-frame work as
fixed-shape steps (``CameraHead.frame_step``, ``DPTHead.frame_step``). Here each step is built
once per :class:`HeadKey` (compiled with ``compile``, captured where the fast path captures)
and replayed; a step that cannot be built steps that head down ('camera_head', 'depth_head',
'dino_trunk': ``fast_path.py``), which then runs eagerly, independently of the aggregator.
The camera head's step reads its stream's cache, so it is built per stream; a scale pass runs
the heads eagerly (its shapes are used once).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .captured import CapturedCall
from .fast_path import FastPathState
from ..frames import Role
from ..model.aggregator import Aggregator
from ..model.heads.camera_head import CameraHead
from ..model.heads.dpt_head import DPTHead
from ..profiling import step_range


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


class HeadSteps:
    """The built head steps of an engine's streams, by head and stream."""

    def __init__(self, aggregator: Aggregator, camera_head: CameraHead,
                 depth_head: DPTHead | None, fast_path: FastPathState) -> None:
        self._agg = aggregator
        self._camera = camera_head
        self._depth = depth_head
        self.fast_path = fast_path
        self._head_steps: dict[tuple[str, int], tuple[HeadKey, CapturedCall]] = {}
        """Built head steps by (part, id of the stream's camera cache; 0 for the others)."""
        self.step_builds: Counter[str] = Counter()
        """Head steps built so far by part (each build captures: diagnostics and tests)."""

    def release_stream(self, camera_cache: object) -> None:
        """Drop the head steps captured against a closed stream's camera cache."""
        self._head_steps.pop(('camera head', id(camera_cache)), None)

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
        """Run the depth head on a batch's taps (``DPTHead.forward``), one step per batch size."""
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
