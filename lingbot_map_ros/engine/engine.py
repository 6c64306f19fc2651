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
"""Engine: one model, one fast path and one KV page pool per device; streams take turns on them.

The engine loads the weights once, builds its runner once (``runner/``: the mode asked for and
in effect, the fallback counters, compile, capture; :meth:`Engine.run` is the one way the model
runs) and, at the first frame of an image size, the
KV page pool (``cache/kv_pool.py``) sized from ``cache.streams`` / ``cache.pool_pages``.
:meth:`Engine.open_stream` hands out an :class:`EngineStream`: one stream's caches
(``model/stream_state.py``) and the calls of the streaming schedule on them. A stream leases
its pages at its first frame and returns them on :meth:`EngineStream.reset` or
:meth:`EngineStream.close`; a stream that finds the pool full is refused with
``PoolExhaustedError`` before anything is written, and no other stream is touched.

``StreamingSession`` (``pipeline.py``) builds a private engine unless it is given one; several
sessions (cameras, a rollover's next session) can share one engine. Calls on one engine are
serialised by its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
import logging
from pathlib import Path
import threading
import time

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.cache.kv_pool import KVPool, PoolStats
from lingbot_map_ros.engine.cache.stream_cache import new_kv_pool, tokens_per_frame
from lingbot_map_ros.engine.cache.stream_kv import StreamKV
from lingbot_map_ros.engine.device import resolve_device, resolve_dtypes
from lingbot_map_ros.engine.errors import ResolutionChangedError
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.golden_weights import fill_golden_weights
from lingbot_map_ros.engine.model.stream_state import StreamState
from lingbot_map_ros.engine.model.weights import load_checkpoint, load_weights
from lingbot_map_ros.engine.profiling import activated, step_range, StepProfiler
from lingbot_map_ros.engine.runner.fast_path import FastPathState
from lingbot_map_ros.engine.runner.jobs import Job, Outcome
from lingbot_map_ros.engine.runner.runner import Runner
from lingbot_map_ros.engine.scale_pass import ScalePass
from lingbot_map_ros.engine.stats import CacheStats
import torch

_LOG = logging.getLogger(__name__)
_CAMERA_FRAMES_RESERVED = 1024
"""Most camera-head cache frames reserved at warm-up (128 MiB at the official size): the
head attends over every reserved slot, so a session limit beyond it grows the buffer instead."""


class Engine:
    """The shared part of every stream on one device: model, fast path, page pool."""

    def __init__(self, config: EngineConfig, model: LingbotMapModel, weights: str) -> None:
        """Take a loaded model (on its device, cast) and build the fast path.

        Use :meth:`load` to build the model too.

        Args:
            config: engine configuration (model, cache, and the stream section's device,
                dtype, fast path and compile).
            model: the network, weights loaded, in eval mode on the configured device.
            weights: what was loaded (checkpoint path or 'random (seed N)').
        """
        self.config = config
        self.device = resolve_device(config)
        self.compute_dtype, self.kv_dtype = resolve_dtypes(config, self.device)
        self.model = model
        self.weights = weights
        # On the CPU there are no graphs to replay: the fast path only pays with compile.
        stream = config.stream
        on_cpu_uncompiled = self.device.type != 'cuda' and not stream.compile
        self.fast_path = FastPathState('eager' if on_cpu_uncompiled else stream.fast_path,
                                       stream.compile)
        """The mode of every stream of this engine and its fallback counters."""
        self.runner = Runner(model, self.fast_path, config.cache.kernel.lanes)
        """Runs every stream's jobs, through the fast path (reads and lowers ``fast_path``)."""
        self.lock = threading.RLock()
        """Serialises the calls of every stream (one model, one pool)."""
        self._pool: KVPool | None = None
        self._warmed_sizes: set[tuple[int, int]] = set()
        self.check_frames = 0
        """Frames of one scale pass beside the streams' (a loop-closure check) that the pool
        makes room for when it is built; set before the first frame."""
        self._profiler: StepProfiler | None = None

    @classmethod
    def load(cls, config: EngineConfig, weights: str | Path | None = None, *,
             allow_random_weights: bool = False, seed: int = 0) -> 'Engine':
        """Build the model on the configured device and load its weights.

        Args:
            config: engine configuration.
            weights: checkpoint (.safetensors, .pt, .pth); None only with
                ``allow_random_weights``.
            allow_random_weights: run with random weights (demos, tests); logs a loud warning.
            seed: seed of the random weights.

        Raises:
            ValueError: no weights and random weights not allowed, or a device/backend mismatch.
            WeightsError: the checkpoint does not match the model.
        """
        device = resolve_device(config)
        compute_dtype, _ = resolve_dtypes(config, device)
        if weights is None and not allow_random_weights:
            raise ValueError('no weights given: set the checkpoint path (lingbot-map.pt or '
                             '.safetensors), or allow random weights explicitly for a demo')
        model = LingbotMapModel.empty(config.model)
        if weights is not None:
            load_weights(model, load_checkpoint(weights))
            loaded = str(weights)
        else:
            _LOG.warning('*** RANDOM WEIGHTS (seed %d): poses, depth and clouds are meaningless. '
                         'This is for demos and tests only; pass a checkpoint for real use. ***',
                         seed)
            # The golden-weights formula (salt = seed) rather than torch's init: deterministic
            # on every machine and scaled so activations stay O(1) through all blocks.
            fill_golden_weights(model, salt=seed)
            loaded = f'random (seed {seed})'
        if compute_dtype != torch.float32:
            # Cast before the move: the float32 aggregator (3.4 GiB) never reaches the GPU.
            model.cast_aggregator(compute_dtype)
            if config.stream.camera_head_dtype == 'bfloat16':
                model.camera_head.set_compute_dtype(torch.bfloat16)
        model = model.to(device).eval()
        return cls(config, model, loaded)

    @property
    def pool(self) -> KVPool | None:
        """Return the page pool; None before the first frame."""
        return self._pool

    @property
    def profiler(self) -> StepProfiler | None:
        """Return the profiler that records the engine's step ranges; None: none recorded."""
        return self._profiler

    def set_profiler(self, profiler: StepProfiler | None) -> None:
        """Record the engine's step ranges (``profiling.STEPS``) with ``profiler`` (benchmarks).

        Every later call of the engine's streams and batches runs with it active; None stops.
        """
        with self.lock:
            self._profiler = profiler

    def profiled(self) -> AbstractContextManager[object]:
        """Return the context of one engine call: its profiler active (a no-op without one)."""
        return activated(self._profiler)

    def pool_stats(self) -> PoolStats:
        """Return the pool's occupancy (zeros before the pool exists)."""
        with self.lock:
            return PoolStats(0, 0, 0) if self._pool is None else self._pool.stats()

    def run(self, jobs: Sequence[Job], overlap: Callable[[], None] | None = None
            ) -> list[Outcome]:
        """Run ``jobs`` (each on another stream of this engine) through the runner.

        The jobs that can share a batch run as one (``runner/runner.py``); a job the model
        refuses (``Aggregator.prepare``: time index, pool, size) gets its error as its outcome
        and the others go on.

        Args:
            jobs: the calls to run.
            overlap: host work to run after the launches, before the wait for the outputs
                (a rollover's preparation); its device work queues behind the jobs'.

        Returns:
            Per job, its outcome.
        """
        with self.lock, self.profiled():
            start = time.perf_counter()
            outs = self.runner.run(jobs)
            if overlap is not None:
                overlap()
            if self.device.type == 'cuda':
                with step_range('wait (sync)'):
                    torch.cuda.synchronize(self.device)
            model_ms = (time.perf_counter() - start) * 1e3
        return [Outcome(out, 0.0 if isinstance(out, Exception) else model_ms, size)
                for out, size in outs]

    def open_stream(self) -> EngineStream:
        """Return a new stream on this engine (its pages are leased at its first frame)."""
        return EngineStream(self)

    def pool_for(self, size_hw: tuple[int, int]) -> KVPool:
        """Return the pool for frames of processed size ``size_hw``, built on first use.

        A pool of another frame size that no stream holds is freed first (gigabytes).

        Raises:
            ResolutionChangedError: other streams hold pages of a pool of another size.
        """
        with self.lock:
            tokens = tokens_per_frame(self.config.model, size_hw)
            pool = self._pool
            if pool is not None and pool.tokens_per_frame == tokens:
                return pool
            if pool is not None and pool.num_streams:
                raise ResolutionChangedError(
                    f'frames of {tokens} tokens, but {pool.num_streams} stream(s) hold pages of '
                    f'the engine pool for frames of {pool.tokens_per_frame}; one engine serves '
                    'one image size at a time')
            self.runner.bind_pool(None)  # drop graphs that write into the old pool
            self._pool = None
            self._pool = new_kv_pool(self.config.model, self.config.cache, self.kv_dtype,
                                     size_hw, self.device, self.check_frames)
            self.runner.bind_pool(self._pool)
            return self._pool

    def warm_up(self, stream: EngineStream, tensor: torch.Tensor, size_hw: tuple[int, int],
                with_depth: bool) -> None:
        """Build the fast path for this frame size before a stream uses it (once per engine).

        Runs the model on copies of ``tensor`` (N_s scale frames, a keyframe, a non-keyframe)
        on ``stream``'s own pages and empties the stream again. Also built here, so that no
        capture lands on a streaming frame later: the camera-head cache at its session size
        (a buffer that grows mid-stream re-captures the head's step) and the one-frame DINO
        step a rollover's preparation runs.
        """
        num_scale = self.config.cache.scale_frames
        with self.lock:
            if size_hw in self._warmed_sizes or self.fast_path.mode.aggregator == 'eager' \
                    or num_scale + 2 > self.config.model.max_frame_num:
                return
            start = time.perf_counter()
            _LOG.info('building the fast path for %dx%d frames (one-off: compilation, CUDA '
                      'graphs)', size_hw[1], size_hw[0])
            image = tensor.to(self.device)[None]
            try:
                with self.model.call_context(stream.state), torch.no_grad():
                    self.model.camera_head.reserve_cache(
                        min(self.config.cache.max_total_frames, _CAMERA_FRAMES_RESERVED))
                    self.runner.dino(image)
                stream.forward_scale(image.expand(num_scale, -1, -1, -1), with_depth)
                # A keyframe, then a non-keyframe at the time index the next keyframe would get.
                for offset, keyframe in ((0, True), (1, False)):
                    stream.forward_frame(image, num_scale + offset, keyframe, with_depth)
                # The full-window graphs too: captured here, not when the window first fills.
                self.runner.prepare_full_window(Job(stream.state, image, num_scale, 'keyframe',
                                                    with_depth))
            finally:
                stream.clear()
            self._warmed_sizes.add(size_hw)
            _LOG.info('fast path ready in %.1f s', time.perf_counter() - start)


class EngineStream:
    """One stream of an engine: its caches and the schedule's calls on them."""

    def __init__(self, engine: Engine) -> None:
        """Open a stream with empty caches (no pages until its first frame)."""
        self.engine = engine
        self.state = StreamState(camera=engine.model.new_camera_cache())
        self._closed = False

    def start(self, size_hw: tuple[int, int]) -> None:
        """Make sure the stream holds pages for frames of ``size_hw`` (leased once).

        Raises:
            PoolExhaustedError: the pool has no room for the stream (nothing changed).
            ResolutionChangedError: other streams use the pool at another size.
        """
        engine = self.engine
        with engine.lock:
            if self._closed:
                raise ValueError('start on a closed stream')
            kv = self.state.kv
            tokens = tokens_per_frame(engine.config.model, size_hw)
            if kv is not None and kv.lease is not None and kv.tokens_per_frame == tokens:
                return
            self.reset()
            self.state.kv = None  # no reference left to a pool of another size
            self.state.kv = StreamKV.for_cache(engine.pool_for(size_hw), engine.config.cache)

    def forward_scale(self, images: torch.Tensor, with_depth: bool = False,
                      return_taps: bool = False, with_descriptor: bool = False) -> dict:
        """Run the scale pass on this stream: a job of its own (``Engine.run``).

        Returns:
            As ``LingbotMapModel.forward_scale``.

        Raises:
            The error that refused the job.
        """
        return self._run(Job(self.state, images, 0, 'scale', with_depth, with_descriptor,
                             return_taps))

    def forward_frame(self, image: torch.Tensor, time_index: int, keyframe: bool,
                      with_depth: bool = False, return_taps: bool = False,
                      with_descriptor: bool = False) -> dict:
        """Run one streaming frame on this stream: a batch of one (``Engine.run``).

        Returns:
            As ``LingbotMapModel.forward_frame``.

        Raises:
            The error that refused the job.
        """
        return self._run(Job(self.state, image, time_index,
                             'keyframe' if keyframe else 'non-keyframe', with_depth,
                             with_descriptor, return_taps))

    def _run(self, job: Job) -> dict:
        out = self.engine.run([job])[0].out
        if isinstance(out, Exception):
            raise out
        return out

    def clear(self) -> None:
        """Forget every cached frame; the pages and the camera cache's memory stay."""
        with self.engine.lock:
            if self.state.kv is not None:
                self.state.kv.reset()
            self.state.camera.reset(keep_memory=True)

    def reset(self) -> None:
        """Forget every cached frame and return the stream's pages to the pool.

        The released cache still reports its (empty) counters until the next frame leases
        pages again.
        """
        with self.engine.lock:
            if self.state.kv is not None:
                self.state.kv.release()
            self.state.camera.reset(keep_memory=True)

    def close(self) -> None:
        """End the stream: pages back to the pool, camera cache and captured steps freed."""
        with self.engine.lock:
            self.reset()
            self.state.kv = None
            self.state.camera.reset()
            self.engine.runner.release_stream(self.state.camera)
            self._closed = True

    # ---- a rollover's next session, prepared beside this stream (scale_pass.py)
    # ----

    def sibling(self) -> EngineStream:
        """Return a new stream on the same engine (a rollover's next session)."""
        return self.engine.open_stream()

    def scale_pass(self, images: torch.Tensor, with_depth: bool = False) -> ScalePass:
        """Return the scale pass of ``images`` on this stream, to run unit by unit.

        The stream must hold no pages (a new or reset stream); see ``scale_pass.ScalePass``.
        """
        return ScalePass(self, images, with_depth)

    def cache_stats(self) -> CacheStats | None:
        """Occupancy of the stream's caches and of the pool; None before its first frame."""
        with self.engine.lock:
            kv = self.state.kv
            if kv is None:
                return None
            camera = self.state.camera.stats()
            return CacheStats.from_manager(kv.stats(), camera.num_frames, camera.allocated_bytes)
