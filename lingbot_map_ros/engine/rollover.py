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
"""RolloverSession: one continuous trajectory over many bounded engine sessions.

A :class:`~lingbot_map_ros.engine.pipeline.StreamingSession` is bounded by the RoPE table
(``model.max_frame_num``), the cache (``cache.max_total_frames``) and the training length of
the model (about 320 views). This layer wraps it with the same public API (``step``,
``step_tensor``, ``flush``, ``reset``, ``stats``, ``config``) and rolls it over before any
limit, so the node and the offline replay (both through ``StreamFeeder``) and the benchmark
see one stream:

1. It keeps the preprocessed images and the published poses of the last
   ``stream.overlap_keyframes`` keyframes in a ring buffer: the very device tensors the session
   ran on (``FramePrediction.network_input``), so nothing is uploaded again.
2. When the session holds ``stream.session_keyframes`` keyframes, the next frame first rolls
   over: the session is reset and the buffered keyframes run again as the new session's scale
   phase (their new poses are not published again), then the frame runs in the new session.
3. :func:`~lingbot_map_ros.engine.stitching.align_sim3` fits the new session's overlap poses to
   the published ones; every later pose of that session is mapped through that Sim(3), which
   already contains all earlier ones (the reference poses are continuous). When depth runs,
   the scale is the median depth ratio over the overlap instead (upstream's choice); without
   depth, when the overlap cannot observe scale (a still camera), the previous one is kept.
4. With a depth camera (``metric.source: depth``) :class:`~.metric_session.MetricSession`
   gives each session its scale in metres, and the mapping uses it instead of the fitted
   scale (which stays in the statistics as a check).

Predictions carry the continuous pose in ``c2w`` (``session_c2w`` keeps the session's own),
a depth map scaled by the same factor (translation and depth keep one scale), ``frame_index``
counted since the last reset, and the session number. ``pose_enc`` stays the network's, and
``tag`` the caller's: a prediction finds its frame by what it carries, not by its stamp.

Every input frame gets exactly one prediction: the overlap frames were already published by
the ending session. Only :meth:`reset` (or an error the caller resets on) starts a new
origin.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
import threading
import time
from typing import Any

import numpy as np
import torch

from .frame_job import FrameJob
from .frames import FrameTag
from .metric_session import MetricSession
from .pipeline import StreamingSession
from .prediction import FramePrediction, host_maps
from .preprocess import PreprocessInfo
from .stats import RolloverStats, SessionStats
from .stitching import fit_rollover, Sim3Alignment
from ..config import MetricConfig


@dataclasses.dataclass(frozen=True, slots=True)
class _Keyframe:
    tensor: torch.Tensor
    """The image the session ran on, on its device (``FramePrediction.network_input``)."""
    info: PreprocessInfo
    tag: FrameTag
    c2w: np.ndarray
    """Published (continuous) pose."""
    depth: torch.Tensor | None
    """Published (continuous-scale) depth on the device, when depth runs."""


class RolloverSession:
    """A StreamingSession that rolls over into Sim(3)-stitched sessions (module docstring)."""

    def __init__(self, session: StreamingSession, metric: MetricConfig | None = None) -> None:
        """Wrap ``session``; its config's ``stream.session_keyframes`` / ``overlap_keyframes``.

        ``metric``: the ``metric.*`` settings (default: no depth camera, model units).
        """
        self._session = session
        self._lock = threading.RLock()
        # The overlap is read-only at run time, so the ring's length is fixed at start.
        self._ring: collections.deque[_Keyframe] = collections.deque(
            maxlen=session.config.stream.overlap_keyframes)
        self._alignment: Sim3Alignment | None = None
        self._frames_out = 0
        self._rollover_ms: float | None = None
        self._stats = RolloverStats()
        # Metric scale hook (engine/metric_session.py): callers hand depth to ``metric``.
        self.metric = MetricSession(metric or MetricConfig(), session.config.stream
                                    .overlap_keyframes, session.config.cache.scale_frames)

    # ---- the StreamingSession API -------------------------------------------------------------

    @property
    def config(self) -> Any:
        """Return the engine configuration in use."""
        return self._session.config

    def apply_config(self, config: Any) -> None:
        """Apply live settings between frames (``StreamingSession.apply_config``)."""
        with self._lock:
            self._session.apply_config(config)

    @property
    def weights(self) -> str:
        """Return what the wrapped session loaded."""
        return self._session.weights

    @property
    def model(self) -> Any:
        """Return the wrapped session's network."""
        return self._session.model

    @property
    def session(self) -> StreamingSession:
        """Return the wrapped session."""
        return self._session

    def step(self, image: np.ndarray | str | Path, tag: FrameTag | int
             ) -> list[FramePrediction]:
        """As ``StreamingSession.step``, rolling over first when the session is full."""
        tensor, info, preprocess_ms = self._session.preprocess(image)
        return self.step_tensor(tensor, info, tag, preprocess_ms)

    def preprocess(self, image: np.ndarray | str | Path
                   ) -> tuple[torch.Tensor, PreprocessInfo, float]:
        """Preprocess as :meth:`step` does (``StreamingSession.preprocess``)."""
        return self._session.preprocess(image)

    def step_tensor(self, tensor: torch.Tensor, info: PreprocessInfo, tag: FrameTag | int,
                    preprocess_ms: float = 0.0) -> list[FramePrediction]:
        """As ``StreamingSession.step_tensor``; raises what it raises (the rollover too)."""
        with self._lock:
            if self._due():
                self._rollover()
            return self._publish(self._session.step_tensor(tensor, info, tag, preprocess_ms))

    # Batched frames across streams (engine/camera_batch.py): the session's two phases.
    def frame_job(self, tensor: torch.Tensor, info: PreprocessInfo, tag: FrameTag | int,
                  preprocess_ms: float = 0.0) -> FrameJob | None:
        """As ``StreamingSession.frame_job``; None also when a rollover is due."""
        with self._lock:
            return None if self._due() else self._session.frame_job(tensor, info, tag,
                                                                    preprocess_ms)

    def finish_job(self, job: FrameJob, out: Any, model_ms: float) -> list[FramePrediction]:
        """As ``StreamingSession.finish_job``, the predictions stitched as :meth:`step`'s."""
        with self._lock:
            return self._publish(self._session.finish_job(job, out, model_ms))

    def flush(self) -> list[FramePrediction]:
        """Run buffered scale frames now (end of a short stream)."""
        with self._lock:
            return self._publish(self._session.flush())

    def _publish(self, preds: list[FramePrediction]) -> list[FramePrediction]:
        self.metric.observe(preds)  # metric hook: before any is stitched
        return [self._stitch(pred) for pred in preds]

    def reset(self) -> dict[str, int]:
        """Reset the session and the stitching: the next frame starts a new origin."""
        with self._lock:
            cleared = self._session.reset()
            self._ring.clear()
            self._alignment = None
            self._frames_out = 0
            self._rollover_ms = None
            self.metric.reset()  # metric hook
            self._stats.sessions += 1
            self._stats.session_keyframes = 0
            return cleared

    def stats(self) -> SessionStats:
        """Return the current engine session's statistics (:meth:`rollover_stats` for ours)."""
        return self._session.stats()

    def rollover_stats(self) -> RolloverStats:
        """Return a copy of the rollover counters (every field always set)."""
        with self._lock:
            return dataclasses.replace(self._stats)

    # ---- rollover -------------------------------------------------------------------------------

    def _due(self) -> bool:
        stream = self.config.stream
        return (self._stats.session_keyframes >= stream.session_keyframes
                and len(self._ring) >= stream.overlap_keyframes)

    def _rollover(self) -> None:
        """Start the next session on the overlap keyframes and align it (module docstring)."""
        start = time.perf_counter()
        overlap = list(self._ring)
        self._session.reset()
        preds: list[FramePrediction] = []
        for kf in overlap:
            preds += self._session.step_tensor(kf.tensor, kf.info, kf.tag)
        preds += self._session.flush()
        if len(preds) != len(overlap):
            raise RuntimeError(f'rollover: {len(overlap)} overlap frames gave {len(preds)} '
                               'predictions')
        # One prediction per overlap frame, in feeding order.
        reference = np.stack([kf.c2w for kf in overlap])
        ses = np.stack([p.c2w for p in preds])
        previous = self._alignment.scale if self._alignment is not None else 1.0
        # Upstream's choice when depth runs: the scale from the depth ratio over the overlap,
        # robust to pose noise and defined for a still camera (docs/odometry.md); an
        # implausible scale change is refused (stitching.fit_rollover).
        depths = None
        if all(kf.depth is not None and p.depth is not None for kf, p in zip(overlap, preds)):
            # One host copy each (a rollover already waits).
            depths = (list(host_maps([kf.depth for kf in overlap])),
                      list(host_maps([p.depth for p in preds])))
        self._alignment = fit_rollover(reference, ses, previous, depths)
        # Metric hook: the session's metric scale replaces the fitted one (kept as a check).
        self.metric.start_session(preds, reference, ses, self._alignment)
        stats = self._stats
        stats.sessions += 1
        stats.rollovers += 1
        stats.session_keyframes = sum(p.is_keyframe for p in preds)
        stats.last_scale = self._alignment.scale
        stats.last_residual = self._alignment.residual
        stats.last_degenerate = self._alignment.degenerate
        stats.degenerate_alignments += int(self._alignment.degenerate)
        stats.last_rejected_scale = self._alignment.rejected_scale
        stats.rejected_scales += int(self._alignment.rejected_scale is not None)
        if preds[0].network_input.is_cuda:
            torch.cuda.synchronize(preds[0].network_input.device)
        self._rollover_ms = (time.perf_counter() - start) * 1e3
        stats.last_rollover_ms = self._rollover_ms
        stats.max_rollover_ms = max(stats.max_rollover_ms, self._rollover_ms)

    def _stitch(self, pred: FramePrediction) -> FramePrediction:
        """Map a session prediction into the continuous frame; remember it if it is a keyframe."""
        c2w, depth = pred.c2w, pred.depth
        alignment = self.metric.alignment(self._alignment)  # metric hook: metres when known
        if alignment is not None:
            c2w = alignment.apply(pred.c2w)
            if depth is not None:  # on the device, no sync
                depth = depth * float(alignment.scale)
        timings = pred.timings_ms
        if self._rollover_ms is not None:
            # The frame that waited for the rollover carries its cost.
            timings = dict(timings, rollover=self._rollover_ms,
                           total=timings.get('total', 0.0) + self._rollover_ms)
            self._rollover_ms = None
        if pred.is_keyframe:
            self._stats.session_keyframes += 1
            self._ring.append(_Keyframe(pred.network_input, pred.preprocess, pred.tag, c2w,
                                        depth))
        out = dataclasses.replace(pred, c2w=c2w, depth=depth, frame_index=self._frames_out,
                                  timings_ms=timings, session=self._stats.sessions - 1,
                                  session_c2w=pred.c2w)
        self._frames_out += 1
        return out
