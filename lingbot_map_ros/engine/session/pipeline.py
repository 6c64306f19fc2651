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
"""StreamingSession: feed frames one at a time, get per-frame camera predictions.

The session is the one owner of the streaming counters (frame index, keyframe count = RoPE time
index) and of the phase logic; the model only runs what it is told:

- **Scale phase.** The first ``N_s = cache.scale_frames`` frames are buffered. When the N_s-th
  arrives they run together (bidirectional attention) and their N_s predictions come out at once,
  so poses of the first N_s frames are delayed until then. ``flush()`` runs a shorter scale phase
  on what is buffered (end of a stream shorter than N_s).
- **Streaming.** Every later frame is one model call. Frame i is a keyframe iff ``K <= 1`` or
  ``(i - N_s) % K == 0`` (K = ``stream.keyframe_interval``); keyframes are cached, non-keyframes
  attend to the cache plus themselves and are discarded. Time index = keyframes cached so far.
- **Limits.** Before a frame touches any cache the model checks the RoPE table
  (``model.max_frame_num``) and the cache capacity (``cache.max_total_frames``) and raises
  :class:`TimeIndexLimitError` / :class:`CachePoolExhaustedError`
  (``Aggregator.prepare``, the one place these limits are checked); a frame whose processed size
  differs from the session's raises :class:`ResolutionChangedError`. In those cases the session is
  unchanged: call ``reset()`` and resubmit. A NaN/Inf pose raises :class:`NonFiniteOutputError`
  after the frame ran (the cache holds it): reset.

**Jobs.** Every model call is a job (``frame_job.py``): :meth:`StreamingSession.frame_job`
plans it, the stream's engine runs it (``Engine.run``; beside other streams' jobs when several
cameras feed at once, ``cameras/camera_batch.py``), :meth:`StreamingSession.finish_job` takes
its outcome. ``step`` is those three for one frame: a single frame is a batch of one.

**Engine.** The model, the fast path and the KV page pool belong to an ``Engine``
(``engine.py``); the session is one stream of it. Without an engine argument the session builds
a private one; sessions given the same engine share the weights and the pool. The session's
stream leases its pages at the first frame of a size and returns them on ``reset()``.

**Warm-up.** With the fast path on (CUDA graphs, ``torch.compile``), the first frame of each
processed size first runs a throw-away scale pass and two streaming frames on copies of itself
(compilation, graph capture, cuDNN plans: tens of seconds compiled, once per size and engine;
docs/performance.md, 'Scale pass and warm-up'), then empties the stream. Otherwise that one-off
cost would land on the first streaming frame, between the scale frames and the rest of the
stream: a hole of that length in the trajectory a live camera keeps moving through.

All public methods are serialised by one lock, so a ROS service thread may call ``reset()`` while
a worker thread is inside ``step()``; the reset waits for that frame to finish.
"""

from __future__ import annotations

from dataclasses import replace
import logging
from pathlib import Path
import threading
import time
from typing import Callable

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.device import gpu_memory
from lingbot_map_ros.engine.engine import Engine, EngineStream
from lingbot_map_ros.engine.errors import (CachePoolExhaustedError, CacheStateError,
                                           ResolutionChangedError,
                                           TimeIndexLimitError)
from lingbot_map_ros.engine.frames import frame_tag, FrameTag
from lingbot_map_ros.engine.image.preprocess import preprocess_image, PreprocessInfo
from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.runner.jobs import Outcome
from lingbot_map_ros.engine.session.frame_job import FrameJob, run_jobs
from lingbot_map_ros.engine.session.prediction import (check_finite, frame_prediction,
                                                       FramePrediction)
from lingbot_map_ros.engine.stats import SessionStats
import numpy as np
import torch

_LOG = logging.getLogger(__name__)


class StreamingSession:
    """One camera's streaming state: model, caches, counters and the scale-phase buffer."""

    def __init__(self, config: EngineConfig, weights: str | Path | None = None, *,
                 allow_random_weights: bool = False, seed: int = 0,
                 engine: Engine | None = None, place_descriptors: bool = False) -> None:
        """Open a stream on ``engine``, or build a private engine (model, weights, pool).

        Args:
            config: engine configuration.
            weights: checkpoint (.safetensors, .pt, .pth); None only with
                ``allow_random_weights``. Ignored with ``engine``.
            allow_random_weights: run with random weights (demos, tests); logs a loud warning.
            seed: seed of the random weights.
            engine: an engine to share (its model, fast path and page pool); its
                configuration must equal ``config`` but for the live stream fields.
            place_descriptors: give every keyframe's prediction its place descriptor
                (loop closure; :attr:`place_descriptors`).

        Raises:
            ValueError: no weights and random weights not allowed, a device/backend mismatch,
                or an engine built for another configuration.
            WeightsError: the checkpoint does not match the model.
            ImportError: the FlashInfer backend was asked for and is not installed.
        """
        if engine is None:
            engine = Engine.load(config, weights, allow_random_weights=allow_random_weights,
                                 seed=seed)
        elif _without_live(engine.config) != _without_live(config):
            raise ValueError('StreamingSession: the engine was built for another '
                             'configuration (only stream.keyframe_interval and '
                             'stream.enable_depth may differ)')
        self.config = config
        self._engine = engine
        self.weights = engine.weights
        self._device = engine.device
        self._compute_dtype = engine.compute_dtype
        self._stream: EngineStream = engine.open_stream()
        """The session's stream: its KV pages (leased at the first frame of a size) and its
        camera-head cache."""
        self._lock = threading.RLock()
        self._pending: list[tuple[torch.Tensor, PreprocessInfo, FrameTag]] = []
        self._size_hw: tuple[int, int] | None = None
        self._frames_in = 0
        self._frames_out = 0
        self._keyframes = 0
        self._generation = 0
        """Resets so far: a job planned before a reset is refused (``finish_job``)."""
        self.place_descriptors = place_descriptors
        """Keyframes' predictions carry ``descriptor`` (pooled DINO tokens, a few KB each;
        ``model/place_descriptor.py``). Read per frame, like the live stream fields: the loop
        closure turns it on. Nothing else about a frame changes with it."""

    # ---- public API -----------------------------------------------------------------------

    def step(self, image: np.ndarray | str | Path, tag: FrameTag | int) -> list[FramePrediction]:
        """Feed one frame.

        Args:
            image: ``[H, W, 3]`` uint8 RGB (``[H, W]`` mono accepted) or an image file path.
            tag: the frame's :class:`FrameTag` (or a plain stamp in nanoseconds), returned on
                its prediction.

        Returns:
            ``[]`` while the scale frames are buffered, then the N_s scale predictions at once,
            then one prediction per frame.

        Raises:
            InvalidFrameError: the image cannot be used (session unchanged).
            SessionLimitError: see the module docstring.
        """
        tensor, info, preprocess_ms = self.preprocess(image)
        return self.step_tensor(tensor, info, tag, preprocess_ms)

    def preprocess(self, image: np.ndarray | str | Path
                   ) -> tuple[torch.Tensor, PreprocessInfo, float]:
        """Preprocess ``image`` as :meth:`step` does: tensor, info and the time it took (ms).

        Raises:
            InvalidFrameError: the image cannot be used.
        """
        start = time.perf_counter()
        tensor, info = preprocess_image(image, self.config.stream.image_width,
                                        self.config.model.patch_size)
        return tensor, info, (time.perf_counter() - start) * 1e3

    def step_tensor(self, tensor: torch.Tensor, info: PreprocessInfo, tag: FrameTag | int,
                    preprocess_ms: float = 0.0, *,
                    overlap: Callable[[], None] | None = None) -> list[FramePrediction]:
        """Feed one already preprocessed frame (benchmarks, golden sets).

        The frame's job (:meth:`frame_job`) runs as a batch of one (``frame_job.run_jobs``),
        then :meth:`finish_job` takes its outcome.

        Args:
            tensor: [3, H, W] float in [0, 1], as ``preprocess.preprocess_*`` returns.
            info: how ``tensor`` relates to the original image.
            tag: as for :meth:`step`.
            preprocess_ms: time already spent on preprocessing, for the timings.
            overlap: host work to run while a streaming frame's model call runs on the
                device: after its launches, before the wait for its outputs (a rollover's
                preparation, ``rollover.py``); its device work queues behind the frame's.
                Not called for a scale frame or a frame refused before its call.

        Returns:
            As :meth:`step`.

        Raises:
            SessionLimitError: see the module docstring.
        """
        with self._lock:
            job = self.frame_job(tensor, info, tag, preprocess_ms, overlap=overlap)
            return [] if job is None else self.finish_job(job, run_jobs([job])[0])

    def frame_job(self, tensor: torch.Tensor, info: PreprocessInfo, tag: FrameTag | int,
                  preprocess_ms: float = 0.0, *,
                  overlap: Callable[[], None] | None = None) -> FrameJob | None:
        """Plan the frame's model call; :meth:`finish_job` takes its outcome.

        The first frame of a size leases the stream's pages (and builds the fast path for
        the size); a scale frame is buffered, and the N_s-th one's job is the scale pass of
        all of them. The frame counters do not move before :meth:`finish_job`.

        Args:
            tensor, info, tag, preprocess_ms: as for :meth:`step_tensor`.
            overlap: the streaming frame's overlap work, as for :meth:`step_tensor`.

        Returns:
            The job, or None for a scale frame that is only buffered.

        Raises:
            ResolutionChangedError: the frame's size differs from the session's.
        """
        with self._lock:
            size_hw = info.image_size_hw
            if self._size_hw is not None and size_hw != self._size_hw:
                raise ResolutionChangedError(
                    f'frame size {size_hw} (processed H, W) differs from the '
                    f'session size {self._size_hw}; reset the session to start a new map')
            if self._size_hw is None:
                self._stream.start(size_hw)
                self._engine.warm_up(self._stream, tensor, size_hw, self.with_depth)
                self._size_hw = size_hw
            if self._frames_out == 0 and self._frames_in < self.config.cache.scale_frames:
                self._frames_in += 1
                self._pending.append((tensor, info, frame_tag(tag)))
                if len(self._pending) < self.config.cache.scale_frames:
                    return None
                return self._scale_job(preprocess_ms)
            return self._job(tensor, info, frame_tag(tag), preprocess_ms, overlap)

    def finish_job(self, job: FrameJob, outcome: Outcome) -> list[FramePrediction]:
        """Take a job's outcome: its predictions, or raise its error.

        Raises:
            CacheStateError: the job is not this session's next call.
            SessionLimitError: as :meth:`step_tensor` (the outcome's error itself).
        """
        with self._lock:
            if job.session is not self or job.generation != self._generation or \
                    job.index != self._frames_out:
                raise CacheStateError('finish_job: the job is not the next call of this '
                                      'session (reset or stepped since frame_job)')
            out = outcome.out
            if job.role == 'scale':
                if isinstance(out, BaseException):
                    raise out
                return self._scale_predictions(out, job, outcome.model_ms / len(job.frames))
            if not isinstance(out, (TimeIndexLimitError, CachePoolExhaustedError)):
                self._frames_in += 1  # a limit leaves the session as it was
            if isinstance(out, BaseException):
                raise out
            if not job.with_descriptor:  # a batch asked for them for another stream's frame
                out = {k: v for k, v in out.items() if k != 'descriptor'}
            self._frames_out += 1
            self._keyframes += int(job.keyframe)
            info, tag = job.frames[0]
            pred = frame_prediction(out, 0, job.index, job.role, job.time_index, info, tag,
                                    job.images[0], {'preprocess': job.preprocess_ms,
                                                    'model': outcome.model_ms})
            check_finite([pred])
            return [pred]

    def flush(self) -> list[FramePrediction]:
        """Run the buffered scale frames now (a stream shorter than N_s)."""
        with self._lock:
            if not self._pending:
                return []
            job = self._scale_job(0.0)
            return self.finish_job(job, run_jobs([job])[0])

    def reset(self) -> dict[str, int]:
        """Clear the session, its caches (pages back to the pool) and the counters.

        Returns:
            What was cleared: ``frames`` (predictions made), ``keyframes`` (cached frames),
            ``pending_frames`` (buffered scale frames dropped).
        """
        with self._lock:
            cleared = {'frames': self._frames_out, 'keyframes': self._keyframes,
                       'pending_frames': len(self._pending)}
            self._stream.reset()
            self._pending.clear()
            self._size_hw = None
            self._frames_in = self._frames_out = self._keyframes = 0
            self._generation += 1
            return cleared

    def stats(self) -> SessionStats:
        """Counters, cache statistics, the fast path in effect and memory, for diagnostics."""
        with self._lock:
            state = self._engine.fast_path
            fast, fallbacks = state.mode, state.fallbacks()
            return SessionStats(
                frames_in=self._frames_in, frames_out=self._frames_out,
                keyframes=self._keyframes, time_index=self._keyframes,
                pending_frames=len(self._pending),
                max_time_index=self.config.model.max_frame_num,
                cache=self._stream.cache_stats(),
                backend=self.config.cache.backend, device=str(self._device),
                dtype=str(self._compute_dtype).replace('torch.', ''),
                weights=self.weights, model_preset=self.config.model.preset,
                image_size_hw=self._size_hw, fast_path=fast.aggregator,
                cuda_graphs=fast.aggregator != 'eager' and self._device.type == 'cuda',
                compiled=fast.compiled, whole_frame_graphs=fast.aggregator == 'whole_frame',
                fast_path_fallbacks=sum(fallbacks.values()), **gpu_memory(self._device),
                fast_path_requested=fast.requested, fast_path_reason=fast.reason,
                fallbacks=fallbacks)

    def apply_config(self, config: EngineConfig) -> None:
        """Use ``config`` from the next frame on; only its live fields may differ.

        Live fields (``stream.keyframe_interval``, ``stream.enable_depth``) are read per frame,
        so they can change between frames; call it between sessions (after ``reset``) to keep
        one keyframe rule per map.

        Raises:
            ValueError: a field other than the live ones differs.
        """
        with self._lock:
            if _without_live(config) != _without_live(self.config):
                raise ValueError('apply_config: only stream.keyframe_interval and '
                                 'stream.enable_depth can change in a running session; build a '
                                 'new session for the others')
            self.config = config

    def close(self) -> None:
        """End the session: its pages go back to the engine's pool (the engine stays)."""
        with self._lock:
            self._stream.close()

    # ---- a scale phase run ahead on another stream (rollover.py, ../scale_pass.py) ------------

    def adopt(self, stream: EngineStream, frames: list[tuple[torch.Tensor, PreprocessInfo,
                                                             FrameTag]],
              out: dict) -> list[FramePrediction]:
        """Continue on ``stream``, whose scale pass over ``frames`` already ran (``out``).

        The session starts over as if ``frames`` had been its scale phase; its previous stream
        is left as it is (the caller reset it and keeps it). Returns their predictions.
        """
        with self._lock:
            self._stream = stream
            self._pending = list(frames)
            self._size_hw = frames[0][1].image_size_hw
            self._frames_in = len(frames)
            self._generation += 1
            return self._scale_predictions(out, self._scale_job(0.0), 0.0)

    # ---- phases -----------------------------------------------------------------------------

    def _scale_job(self, prep_ms: float) -> FrameJob:
        """Plan the scale pass over the pending frames (``_frames_out`` is 0)."""
        images = torch.stack([t for t, _, _ in self._pending]).to(self._device)
        return FrameJob(self, images, tuple((info, tag) for _, info, tag in self._pending),
                        prep_ms, 0, 'scale', 0, self.with_depth, self.place_descriptors,
                        self._generation)

    def _scale_predictions(self, out: dict, job: FrameJob,
                           model_ms: float) -> list[FramePrediction]:
        """Turn a scale pass's outputs into its frames' predictions; the session counts them."""
        timings = {'preprocess': job.preprocess_ms, 'model': model_ms}
        preds = [frame_prediction(out, i, i, 'scale', i, info, tag, job.images[i], timings)
                 for i, (info, tag) in enumerate(job.frames)]
        self._pending.clear()
        self._keyframes = self._frames_out = len(preds)
        check_finite(preds)
        return preds

    def _job(self, tensor: torch.Tensor, info: PreprocessInfo, tag: FrameTag, prep_ms: float,
             overlap: Callable[[], None] | None) -> FrameJob:
        index = self._frames_out
        interval = self.config.stream.keyframe_interval
        keyframe = interval <= 1 or (index - self.config.cache.scale_frames) % interval == 0
        return FrameJob(self, tensor.to(self._device)[None], ((info, tag),), prep_ms, index,
                        'keyframe' if keyframe else 'non-keyframe', self._keyframes,
                        self.with_depth, keyframe and self.place_descriptors, self._generation,
                        overlap)

    @property
    def model(self) -> LingbotMapModel:
        """Return the network, for tools that time or inspect its parts (do not step it)."""
        return self._engine.model

    @property
    def engine(self) -> Engine:
        """Return the model, fast path and page pool this session is a stream of."""
        return self._engine

    @property
    def stream(self) -> EngineStream:
        """Return the session's caches on the engine (its stream)."""
        return self._stream

    def replace_stream(self, stream: EngineStream) -> None:
        """Run the following frames on ``stream``; the session's own stream is closed.

        A stand-in network with the stream's interface (tests, synthetic runs; its ``engine``
        runs the session's jobs) goes in here, before the first frame.
        """
        with self._lock:
            self._stream.close()
            self._stream = stream

    @property
    def with_depth(self) -> bool:
        """Whether frames run the depth head (the stream asks for it and the model has one)."""
        return self.config.stream.enable_depth and self.config.model.enable_depth


def _without_live(config: EngineConfig) -> EngineConfig:
    """``config`` with the live stream fields at their defaults (what a running engine fixes)."""
    return replace(config, stream=replace(config.stream, keyframe_interval=1,
                                          enable_depth=False))
