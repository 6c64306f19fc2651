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
- **Streaming.** Every later frame runs alone. Frame i is a keyframe iff ``K <= 1`` or
  ``(i - N_s) % K == 0`` (K = ``stream.keyframe_interval``); keyframes are cached, non-keyframes
  attend to the cache plus themselves and are discarded. Time index = keyframes cached so far.
- **Limits.** Before a frame touches any cache the model checks the RoPE table
  (``model.max_frame_num``) and the cache capacity (``cache.max_total_frames``) and raises
  :class:`TimeIndexLimitError` / :class:`CachePoolExhaustedError`
  (``Aggregator.prepare``, the one place these limits are checked); a frame whose processed size
  differs from the session's raises :class:`ResolutionChangedError`. In those cases the session is
  unchanged: call ``reset()`` and resubmit. A NaN/Inf pose raises :class:`NonFiniteOutputError`
  after the frame ran (the cache holds it): reset.

**Warm-up.** With the fast path on (CUDA graphs, ``torch.compile``), the first frame of each
processed size first runs a throw-away scale pass and two streaming frames on copies of itself
(compilation, graph capture, cuDNN plans: ~30 s compiled on the H200, once per size and
process), then resets the model. Otherwise that one-off cost would land on the first streaming
frame, between the scale frames and the rest of the stream: a 30 s hole in the trajectory a
live camera keeps moving through.

All public methods are serialised by one lock, so a ROS service thread may call ``reset()`` while
a worker thread is inside ``step()``; the reset waits for that frame to finish.
"""

from __future__ import annotations

from dataclasses import replace
import logging
from pathlib import Path
import threading
import time

import numpy as np
import torch

from . import geometry
from .cache import FlashInferKVCacheManager, new_stream_cache, tokens_per_frame
from .device import gpu_memory, resolve_device, resolve_dtypes
from .errors import (CachePoolExhaustedError, NonFiniteOutputError, ResolutionChangedError,
                     TimeIndexLimitError)
from .frames import frame_tag, FrameTag, Role
from .model.gct import LingbotMapModel
from .model.golden_weights import fill_golden_weights
from .model.weights import load_checkpoint, load_weights
from .prediction import FramePrediction
from .preprocess import preprocess_image, PreprocessInfo
from .stats import SessionStats
from ..config import EngineConfig

_LOG = logging.getLogger(__name__)


class StreamingSession:
    """One camera's streaming state: model, caches, counters and the scale-phase buffer."""

    def __init__(self, config: EngineConfig, weights: str | Path | None = None, *,
                 allow_random_weights: bool = False, seed: int = 0) -> None:
        """Build the model, load the weights and prepare the caches.

        Args:
            config: engine configuration.
            weights: checkpoint (.safetensors, .pt, .pth); None only with
                ``allow_random_weights``.
            allow_random_weights: run with random weights (demos, tests); logs a loud warning.
            seed: seed of the random weights.

        Raises:
            ValueError: no weights and random weights not allowed, or a device/backend mismatch.
            WeightsError: the checkpoint does not match the model.
            ImportError: the FlashInfer backend was asked for and is not installed.
        """
        self.config = config
        self._device = resolve_device(config)
        self._compute_dtype, self._kv_dtype = resolve_dtypes(config, self._device)
        if weights is None and not allow_random_weights:
            raise ValueError('no weights given: set the checkpoint path (lingbot-map.pt or '
                             '.safetensors), or allow random weights explicitly for a demo')
        model = LingbotMapModel.empty(config.model)
        if weights is not None:
            load_weights(model, load_checkpoint(weights))
            self.weights = str(weights)
        else:
            _LOG.warning('*** RANDOM WEIGHTS (seed %d): poses, depth and clouds are meaningless. '
                         'This is for demos and tests only; pass a checkpoint for real use. ***',
                         seed)
            # The golden-weights formula (salt = seed) rather than torch's init: deterministic
            # on every machine and scaled so activations stay O(1) through all blocks.
            fill_golden_weights(model, salt=seed)
            self.weights = f'random (seed {seed})'
        if self._compute_dtype != torch.float32:
            # Cast before the move: the float32 aggregator (3.4 GiB) never reaches the GPU.
            model.cast_aggregator(self._compute_dtype)
            if config.stream.camera_head_dtype == 'bfloat16':
                model.camera_head.set_compute_dtype(torch.bfloat16)
        self._model = model.to(self._device).eval()
        # On the CPU there are no graphs to replay: the fast path only pays with compile.
        stream = config.stream
        on_cpu_uncompiled = self._device.type != 'cuda' and not stream.compile
        self._model.set_fast_path('eager' if on_cpu_uncompiled else stream.fast_path,
                                  stream.compile)
        self._kv_cache: FlashInferKVCacheManager | None = None
        """The session's KV cache, built at the first frame of each size (``_start_stream``)."""
        self._lock = threading.RLock()
        self._pending: list[tuple[torch.Tensor, PreprocessInfo, FrameTag]] = []
        self._size_hw: tuple[int, int] | None = None
        self._frames_in = 0
        self._frames_out = 0
        self._keyframes = 0
        self._warmed_sizes: set[tuple[int, int]] = set()

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
        start = time.perf_counter()
        tensor, info = preprocess_image(image, self.config.stream.image_width,
                                        self.config.model.patch_size)
        return self.step_tensor(tensor, info, tag, (time.perf_counter() - start) * 1e3)

    def step_tensor(self, tensor: torch.Tensor, info: PreprocessInfo, tag: FrameTag | int,
                    preprocess_ms: float = 0.0) -> list[FramePrediction]:
        """Feed one already preprocessed frame (benchmarks, golden sets).

        Args:
            tensor: [3, H, W] float in [0, 1], as ``preprocess.preprocess_*`` returns.
            info: how ``tensor`` relates to the original image.
            tag: as for :meth:`step`.
            preprocess_ms: time already spent on preprocessing, for the timings.

        Returns:
            As :meth:`step`.

        Raises:
            SessionLimitError: see the module docstring.
        """
        with self._lock:
            if self._size_hw is not None and info.image_size_hw != self._size_hw:
                raise ResolutionChangedError(
                    f'frame size {info.image_size_hw} (processed H, W) differs from the '
                    f'session size {self._size_hw}; reset the session to start a new map')
            if self._size_hw is None:
                self._start_stream(info.image_size_hw)
                self._warm_up(tensor, info.image_size_hw)
            self._size_hw = info.image_size_hw
            if self._frames_out == 0 and self._frames_in < self.config.cache.scale_frames:
                self._frames_in += 1
                self._pending.append((tensor, info, frame_tag(tag)))
                if len(self._pending) < self.config.cache.scale_frames:
                    return []
                return self._run_scale(preprocess_ms)
            self._frames_in += 1
            try:
                return [self._run_frame(tensor, info, frame_tag(tag), preprocess_ms)]
            except (TimeIndexLimitError, CachePoolExhaustedError):
                self._frames_in -= 1
                raise

    def flush(self) -> list[FramePrediction]:
        """Run the buffered scale frames now (a stream shorter than N_s)."""
        with self._lock:
            return self._run_scale(0.0) if self._pending else []

    def reset(self) -> dict[str, int]:
        """Clear the session, the model caches and the counters.

        Returns:
            What was cleared: ``frames`` (predictions made), ``keyframes`` (cached frames),
            ``pending_frames`` (buffered scale frames dropped).
        """
        with self._lock:
            cleared = {'frames': self._frames_out, 'keyframes': self._keyframes,
                       'pending_frames': len(self._pending)}
            self._reset_caches()
            self._pending.clear()
            self._size_hw = None
            self._frames_in = self._frames_out = self._keyframes = 0
            return cleared

    def stats(self) -> SessionStats:
        """Counters, cache statistics, the fast path in effect and memory, for diagnostics."""
        with self._lock:
            runner = self._model.frame_runner
            fast = runner.stats()
            graphs = runner.graphs
            return SessionStats(
                frames_in=self._frames_in, frames_out=self._frames_out,
                keyframes=self._keyframes, time_index=self._keyframes,
                pending_frames=len(self._pending),
                max_time_index=self.config.model.max_frame_num,
                cache=self._model.cache_stats(),
                backend=self.config.cache.backend, device=str(self._device),
                dtype=str(self._compute_dtype).replace('torch.', ''),
                weights=self.weights, model_preset=self.config.model.preset,
                image_size_hw=self._size_hw, fast_path=fast.mode,
                cuda_graphs=fast.mode != 'eager' and self._device.type == 'cuda',
                compiled=fast.compiled,
                whole_frame_graphs=graphs is not None and graphs.staged,
                fast_path_fallbacks=fast.fallbacks, **gpu_memory(self._device))

    def apply_config(self, config: EngineConfig) -> None:
        """Use ``config`` from the next frame on; only its live fields may differ.

        Live fields (``stream.keyframe_interval``, ``stream.enable_depth``) are read per frame,
        so they can change between frames; call it between sessions (after ``reset``) to keep
        one keyframe rule per map.

        Raises:
            ValueError: a field other than the live ones differs.
        """
        with self._lock:
            old = self.config.stream
            same_live = replace(config, stream=replace(
                config.stream, keyframe_interval=old.keyframe_interval,
                enable_depth=old.enable_depth))
            if same_live != self.config:
                raise ValueError('apply_config: only stream.keyframe_interval and '
                                 'stream.enable_depth can change in a running session; build a '
                                 'new session for the others')
            self.config = config

    # ---- caches -----------------------------------------------------------------------------

    def _start_stream(self, size_hw: tuple[int, int]) -> None:
        """Keep the attached (reset) KV cache for the same size; build and attach one for a new."""
        cache = self._kv_cache
        if cache is not None and cache.tokens_per_frame == tokens_per_frame(self.config.model,
                                                                            size_hw):
            return
        # Release the old cache before the new one is allocated: both may be gigabytes.
        self._model.stop_stream()
        self._kv_cache = None
        self._kv_cache = new_stream_cache(self.config.model, self.config.cache, self._kv_dtype,
                                          size_hw, self._device)
        self._model.start_stream(self._kv_cache)

    def _reset_caches(self) -> None:
        """Empty the KV cache (kept, with its memory) and the model's camera-head cache."""
        if self._kv_cache is not None:
            self._kv_cache.reset()
        self._model.reset_stream()

    # ---- phases -----------------------------------------------------------------------------

    def _warm_up(self, tensor: torch.Tensor, size_hw: tuple[int, int]) -> None:
        """Build the fast path for this frame size before the stream uses it (module docstring).

        Runs the model on copies of ``tensor`` (N_s scale frames, a keyframe, a non-keyframe)
        and resets it; the session's counters and buffers are not touched.
        """
        runner = self._model.frame_runner
        num_scale = self.config.cache.scale_frames
        if size_hw in self._warmed_sizes or runner.mode == 'eager' \
                or num_scale + 2 > self.config.model.max_frame_num:
            return
        start = time.perf_counter()
        _LOG.info('building the fast path for %dx%d frames (one-off: compilation, CUDA graphs)',
                  size_hw[1], size_hw[0])
        image = tensor.to(self._device)[None]
        try:
            self._model.forward_scale(image.expand(num_scale, -1, -1, -1),
                                      with_depth=self._with_depth)
            # A keyframe, then a non-keyframe at the time index the next keyframe would get.
            for offset, keyframe in ((0, True), (1, False)):
                self._model.forward_frame(image, time_index=num_scale + offset,
                                          keyframe=keyframe, with_depth=self._with_depth)
            # The full-window graphs too: captured here, not when the window first fills.
            runner.prepare_full_window()
        finally:
            self._reset_caches()
        self._warmed_sizes.add(size_hw)
        _LOG.info('fast path ready in %.1f s', time.perf_counter() - start)

    def _run_scale(self, prep_ms: float) -> list[FramePrediction]:
        num = len(self._pending)
        start = time.perf_counter()
        images = torch.stack([t for t, _, _ in self._pending]).to(self._device)
        out = self._model.forward_scale(images, with_depth=self._with_depth)
        model_ms = self._elapsed_ms(start)
        preds = [self._prediction(out, i, i, 'scale', i, info, tag, images[i],
                                  {'preprocess': prep_ms, 'model': model_ms / num})
                 for i, (_, info, tag) in enumerate(self._pending)]
        self._pending.clear()
        self._keyframes = num
        self._frames_out = num
        self._check_finite(preds)
        return preds

    def _run_frame(self, tensor: torch.Tensor, info: PreprocessInfo, tag: FrameTag,
                   prep_ms: float) -> FramePrediction:
        index = self._frames_out
        interval = self.config.stream.keyframe_interval
        keyframe = interval <= 1 or (index - self.config.cache.scale_frames) % interval == 0
        time_index = self._keyframes
        start = time.perf_counter()
        image = tensor.to(self._device)[None]
        out = self._model.forward_frame(image, time_index=time_index, keyframe=keyframe,
                                        with_depth=self._with_depth)
        model_ms = self._elapsed_ms(start)
        self._frames_out += 1
        self._keyframes += int(keyframe)
        role: Role = 'keyframe' if keyframe else 'non-keyframe'
        pred = self._prediction(out, 0, index, role, time_index, info, tag, image[0],
                                {'preprocess': prep_ms, 'model': model_ms})
        self._check_finite([pred])
        return pred

    @property
    def model(self) -> LingbotMapModel:
        """Return the network, for tools that time or inspect its parts (do not step it)."""
        return self._model

    # ---- helpers ------------------------------------------------------------------------------

    @property
    def _with_depth(self) -> bool:
        return self.config.stream.enable_depth and self.config.model.enable_depth

    def _elapsed_ms(self, start: float) -> float:
        if self._device.type == 'cuda':
            torch.cuda.synchronize(self._device)
        return (time.perf_counter() - start) * 1e3

    def _prediction(self, out: dict[str, torch.Tensor], row: int, index: int, role: Role,
                    time_index: int, info: PreprocessInfo, tag: FrameTag, image: torch.Tensor,
                    timings: dict[str, float]) -> FramePrediction:
        # The pose is the one host copy per frame; dense outputs stay on the device. They are
        # copied there (no sync): the model's output buffers are reused by the next frame.
        pose_enc = out['pose_enc'][row].detach().double().cpu().numpy()
        depth = conf = rgb = None
        if 'depth' in out:
            depth = out['depth'][row].detach().to(torch.float32, copy=True)
            conf = out['depth_conf'][row].detach().to(torch.float32, copy=True)
            rgb = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
            rgb = rgb.permute(1, 2, 0)
        c2w = k = k_orig = np.full((4, 4), np.nan)
        if np.isfinite(pose_enc).all():
            c2w = geometry.to_c2w_4x4(geometry.pose_encoding_to_extrinsics(pose_enc))
            k = geometry.pose_encoding_to_intrinsics(pose_enc, info.image_size_hw)
            k_orig = geometry.intrinsics_for_original(k, info)
        timings = dict(timings, total=sum(timings.values()))
        return FramePrediction(
            frame_index=index, tag=tag, role=role, time_index=time_index,
            pose_enc=pose_enc, c2w=c2w, intrinsics=k, intrinsics_original=k_orig,
            preprocess=info, network_input=image, depth=depth, depth_conf=conf, image=rgb,
            timings_ms=timings)

    @staticmethod
    def _check_finite(preds: list[FramePrediction]) -> None:
        for pred in preds:
            if not np.isfinite(pred.pose_enc).all():
                raise NonFiniteOutputError(
                    f'frame {pred.frame_index} ({pred.role}) has a non-finite pose encoding '
                    f'{pred.pose_enc.tolist()}; reset the session')
