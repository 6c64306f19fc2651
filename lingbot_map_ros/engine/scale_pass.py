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
"""ScalePass: a stream's scale pass, run one unit at a time between another stream's frames.

A rollover's next session (``rollover.py``) must run its N_s-frame bidirectional scale pass
before it can serve a frame: the cost of several streaming frames (docs/performance.md, 'Scale
pass and warm-up'). Run at the limit it stalls the stream; run here it is cut into units that
the ending session's frames take turns with, one unit with each served frame (launched while
that frame runs on the device: ``rollover.py``), so the switch has nothing left to compute.

Units, in order (:func:`scale_units` counts them): the DINO trunk of each scale frame (one
frame per unit, through the runner's captured one-frame step ``HeadSteps.dino``), each of
the aggregator's frame/global block pairs (``Aggregator.block_steps``), the camera head on the
N_s camera tokens, and with depth the DPT head of each frame. Every unit runs under the
engine's lock, in the model's call context (``LingbotMapModel.call_context``), on the same
device stream as the frames: the order of the work is fixed, so the CPU and the GPU run the
same code and a test sees what a robot gets.

Pages: the pass never reads the cache (a scale pass attends densely), it only writes each
layer's K/V. They go to a small lease of the pool's headroom: N_s patch pages and the pages
of their specials (``prep_pages``; ``capacity.pool_pages`` reserves them per stream), not a
whole stream's extent. :meth:`ScalePass.install`, at the switch, after the ending stream gave
its extent back, leases the stream's full extent, copies the scale frames' K/V to where that
stream's page table puts them (one gather and one scatter per layer) and returns the lease.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
import time
from typing import Any, ContextManager, Protocol, TYPE_CHECKING

from lingbot_map_ros.engine.cache.kv_pool import KVPool
from lingbot_map_ros.engine.cache.stream_kv import OnPool, prep_pages, StreamKV
from lingbot_map_ros.engine.errors import PoolExhaustedError
from lingbot_map_ros.engine.frames import Role
from lingbot_map_ros.engine.model.heads.camera_head import CameraKVCache
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.config import EngineConfig
    from lingbot_map_ros.engine.model.gct import LingbotMapModel
    from lingbot_map_ros.engine.model.stream_state import StreamState
    from lingbot_map_ros.engine.runner.runner import Runner


class PassEngine(Protocol):
    """What a scale pass uses of the engine (``engine.py``'s ``Engine``, which creates passes)."""

    config: EngineConfig
    model: LingbotMapModel
    runner: Runner
    lock: ContextManager[Any]

    def pool_for(self, size_hw: tuple[int, int]) -> KVPool:
        """Return the engine's page pool for images of ``size_hw``."""


class PassStream(Protocol):
    """The stream a scale pass prepares (``engine.py``'s ``EngineStream``)."""

    engine: PassEngine
    state: StreamState

    def reset(self) -> None:
        """Forget what the stream cached."""


def scale_units(num_frames: int, depth: int, with_depth: bool) -> int:
    """Return the units of a scale pass of ``num_frames`` frames (module docstring)."""
    return num_frames + depth + 1 + (num_frames if with_depth else 0)


@dataclass(frozen=True, slots=True)
class _ScalePlan:
    """What the aggregator's attention reads of a plan in a scale pass: its role."""

    role: Role = 'scale'


class _ScalePages(OnPool):
    """The scale frames' K/V on a lease of the pool's headroom (what a scale pass writes to)."""

    def __init__(self, pool: KVPool, num_frames: int) -> None:
        self.pool = pool
        self.num_frames = 0
        """Frames cached (none: the pass writes but reads nothing)."""
        self._frames = num_frames
        self._lease = pool.lease(pool.new_stream_id(), prep_pages(
            pool.page_size, pool.num_special_tokens, num_frames))
        first, size = self._lease.first_page, pool.page_size
        special_base = (first + num_frames) * size
        self.index = torch.cat([
            pool.storage.frame_index(first + i, special_base + i * pool.num_special_tokens)
            for i in range(num_frames)])

    def remaining_frames(self) -> int:
        return self._frames

    def write(self, plan: Any, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.pool.storage.write(layer, self.index, k, v)

    def _tokens(self) -> list[torch.Tensor]:
        """Flat token views ``[N*T, H, D]`` of every layer's K and V (bytes for FP8)."""
        storage = self.pool.storage
        views = []
        for pages in (*storage.k, *storage.v):
            tokens = pages.view(-1, storage.num_heads, storage.head_dim)
            views.append(tokens.view(torch.uint8) if tokens.element_size() == 1 else tokens)
        return views

    def take(self) -> list[torch.Tensor]:
        """Copy the scale K/V out of the pool and give the pages back (a pool without room)."""
        held = [tokens.index_select(0, self.index) for tokens in self._tokens()]
        self.release()
        return held

    def copy_to(self, kv: StreamKV, held: list[torch.Tensor] | None = None) -> None:
        """Cache the scale frames in ``kv`` (an empty stream): its plan, our K/V."""
        plan = kv.plan_frame('scale', self._frames)
        for i, tokens in enumerate(self._tokens()):
            tokens.index_copy_(0, plan.index, held[i] if held is not None
                               else tokens.index_select(0, self.index))
        kv.end_frame(plan)

    def release(self) -> None:
        if self._lease is not None:
            self.pool.release(self._lease)
            self._lease = None


def _move_camera_frames(dst: CameraKVCache, src: CameraKVCache) -> None:
    """Move ``src``'s cached frames into ``dst``'s buffer (kept: its ``generation`` stays).

    A step captured against ``dst``'s buffer stays valid, so the serving stream's camera head
    replays its graph across switches; ``src`` is left empty, its memory kept.
    """
    num = src.num_frames
    dst.reserve(num, src._buffer.device, src._buffer.dtype)  # noqa: SLF001 - same layout
    dst._buffer[..., :num, :] = src._buffer[..., :num, :]  # noqa: SLF001
    dst.num_frames = num
    src.reset(keep_memory=True)


class ScalePass:
    """The scale pass of ``images`` on ``stream`` (no pages yet), advanced by :meth:`step`.

    Raises:
        PoolExhaustedError: the pool has no room for the scale pages (nothing changed).
        ValueError: depth asked of a model without a depth head.
        See also ``Aggregator.prepare``.
    """

    def __init__(self, stream: PassStream, images: torch.Tensor, with_depth: bool) -> None:
        engine = stream.engine
        model = engine.model
        if with_depth and model.depth_head is None:
            raise ValueError('with_depth=True but the model was built with enable_depth=False')
        self._stream = stream
        self.units = scale_units(images.shape[0], model.config.depth, with_depth)
        """Units of the whole pass."""
        self.done_units = 0
        """Units run so far."""
        self.step_ms = 0.0
        """Host time of the last unit (its launches on CUDA)."""
        with engine.lock:
            pool = engine.pool_for(tuple(images.shape[-2:]))
            self._pages = _ScalePages(pool, images.shape[0])
            try:
                patch_hw = model.aggregator.prepare(images, 0, 'scale', self._pages)
            except BaseException:
                self._pages.release()
                raise
        self._out: dict[str, Any] | None = None
        self._work = self._run(images, patch_hw, with_depth)

    @property
    def done(self) -> bool:
        """Whether every unit ran."""
        return self._out is not None

    @property
    def stream(self) -> PassStream:
        """Return the stream the pass prepares."""
        return self._stream

    @property
    def outputs(self) -> dict[str, Any] | None:
        """Return the pass's outputs once done (as ``forward_scale``'s), None before.

        For a pass that is read, not installed (a loop closure's check: engine/mapping/verify/).
        """
        return self._out

    def step(self) -> None:
        """Run the next unit (nothing once done)."""
        if self.done:
            return
        engine = self._stream.engine
        start = time.perf_counter()
        with engine.lock, torch.no_grad(), engine.model.call_context(self._stream.state):
            try:
                next(self._work)
            except StopIteration as finished:  # the last unit returns the outputs
                self._out = finished.value
            self.done_units += 1
        self.step_ms = (time.perf_counter() - start) * 1e3

    def run_all(self) -> int:
        """Run every unit left now; return how many that was."""
        left = self.units - self.done_units
        while not self.done:
            self.step()
        return left

    def install(self, ending: PassStream | None = None) -> dict[str, Any]:
        """Lease the stream's extent, cache the scale frames in it; return the pass's outputs.

        Call it after the ending stream gave its pages back. With ``ending`` (that stream,
        reset), the two swap camera-head caches, the scale frames moved into the ending one's:
        the serving stream keeps the cache its captured camera-head step reads, so the first
        frame after the switch captures nothing. Outputs as ``LingbotMapModel.forward_scale``.

        Raises:
            PoolExhaustedError: no room for the stream's extent.
        """
        self.run_all()
        engine = self._stream.engine
        config = engine.config.cache
        with engine.lock:
            pool, held = self._pages.pool, None
            try:
                kv = StreamKV.for_cache(pool, config)
            except PoolExhaustedError:
                # No room beside the scale pages (a pool without headroom, or one the pages
                # cut in two): hold the K/V aside for a moment and free the pages first.
                held = self._pages.take()
                kv = StreamKV.for_cache(pool, config)
            self._pages.copy_to(kv, held)
            self._pages.release()
            state = self._stream.state
            state.kv = kv
            if ending is not None:
                _move_camera_frames(ending.state.camera, state.camera)
                state.camera, ending.state.camera = ending.state.camera, state.camera
        return self._out

    def cancel(self) -> None:
        """Drop the pass: its pages go back, the stream forgets what the pass cached."""
        self._pages.release()
        self._stream.reset()

    def _run(self, images: torch.Tensor, patch_hw: tuple[int, int],
             with_depth: bool) -> Generator[None, None, dict[str, Any]]:
        """Run the pass, pausing after each unit (module docstring)."""
        engine = self._stream.engine
        agg, heads = engine.model.aggregator, engine.runner.heads
        frames = []
        for i in range(images.shape[0]):
            frames.append(heads.dino(images[i:i + 1]))
            yield
        dino = torch.cat(frames)
        del frames  # one copy of the DINO tokens held between the units
        features = yield from agg.block_steps(dino, 0, 'scale', patch_hw, self._pages,
                                              _ScalePlan(), camera_only=not with_depth)
        pose_enc, pose_enc_iters = heads.camera(features.taps[-1][:, 0], 'scale')
        out: dict[str, Any] = {'pose_enc': pose_enc, 'pose_enc_iters': pose_enc_iters}
        if with_depth:
            maps = []
            for i in range(images.shape[0]):
                yield  # after the camera head, then between the frames' depth heads
                # A copy: a captured head's output buffer is the next frame's too.
                depth, conf = heads.depth([t[i:i + 1] for t in features.taps],
                                          images.shape[-2:])
                maps.append((depth.clone(), conf.clone()))
            out['depth'] = torch.cat([d for d, _ in maps])
            out['depth_conf'] = torch.cat([c for _, c in maps])
        return out
