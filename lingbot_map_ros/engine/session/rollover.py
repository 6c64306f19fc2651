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

A :class:`~lingbot_map_ros.engine.session.pipeline.StreamingSession` is bounded by the RoPE table
(``model.max_frame_num``), the cache (``cache.max_total_frames``) and the training length of
the model (about 320 views). This layer wraps it with the same public API (``step``,
``step_tensor``, ``flush``, ``reset``, ``stats``, ``config``) and rolls it over before any
limit, so the node and the offline replay (both through ``StreamFeeder``) and the benchmark
see one stream:

1. A ring keeps the last ``stream.overlap_keyframes`` keyframes' device tensors (the session's
   own ``network_input``: nothing is uploaded again) and published poses.
2. **Preparation.** ``lead`` keyframes before the limit (``lead`` = the units of a scale pass,
   ``scale_pass.scale_units``: 33 for the official model, 41 with depth) the ring is frozen as
   the next session's overlap, and the next session's scale pass over its first N_s frames
   starts on a second stream of the engine (``scale_pass.ScalePass``, on N_s pages of the
   pool's headroom). With each frame the ending session serves, one unit of it runs (a DINO
   frame, a block pair, a head), launched while the frame runs on the device, so its host time
   hides behind the frame's; it is ``ready`` before the limit.
3. **Switch.** When the session holds ``stream.session_keyframes`` keyframes, the next frame
   first switches: the ending stream gives its pages back, the prepared one takes its extent
   (the scale K/V copied in), overlap keyframes beyond N_s (when ``overlap_keyframes`` >
   ``cache.scale_frames``) run as its first streaming keyframes, and the frame runs in the new
   session. The two streams alternate from then on (each keeps its captured camera-head step).
4. :func:`~lingbot_map_ros.engine.session.stitching.align_sim3` fits the new session's overlap
   poses to the published (continuous) ones; that Sim(3) maps every later pose of the session. With
   depth the scale is the overlap's median depth ratio (upstream's choice); a still camera
   keeps the previous scale; a depth camera (``metric.source: depth``) gives each session its
   scale in metres (:class:`~.metric_session.MetricSession`; the fit stays as a check).

Every input frame gets exactly one prediction: the ending session publishes every frame up to
the switch, the frames served during the preparation included (they are not in the next
session: its cache goes from the overlap straight to the first frame after the switch, a gap
like a longer keyframe interval); the overlap frames' new poses only align the sessions; the
new session publishes every frame from the switch on. A preparation that cannot run (no
headroom in ``cache.pool_pages``, a session shorter than the lead) leaves the rest of the
scale pass to the switch (``unprepared_switches``): slower, never wrong.

Predictions carry the continuous pose in ``c2w`` (``session_c2w``: the session's own), depth
at the same scale, ``frame_index`` since the last reset, the session number, the network's
``pose_enc`` and the caller's ``tag``; ``timings_ms['rollover']`` marks the switch (its
latency), ``timings_ms['prepare']`` a frame that ran a unit of the preparation.

Only :meth:`reset` (or an error the caller resets on) starts a new origin.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from pathlib import Path
import threading
import time
from typing import Any

from lingbot_map_ros.config import MetricConfig
from lingbot_map_ros.engine.frames import FrameTag
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
from lingbot_map_ros.engine.runner.jobs import Outcome
from lingbot_map_ros.engine.scale_pass import scale_units
from lingbot_map_ros.engine.session.frame_job import FrameJob, run_jobs
from lingbot_map_ros.engine.session.imu_session import ImuSession
from lingbot_map_ros.engine.session.metric_session import MetricSession
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.prediction import FramePrediction, host_maps, with_timing
from lingbot_map_ros.engine.session.stitching import fit_rollover, Sim3Alignment
from lingbot_map_ros.engine.stats import RolloverStats, SessionStats
import numpy as np
import torch

_LOG = logging.getLogger(__name__)


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


@dataclasses.dataclass(slots=True)
class _Preparation:
    overlap: list[_Keyframe]
    """The ring when the preparation was due: the next session's overlap (always: the
    trajectory must not depend on whether the pool let the pass run early)."""
    sensors: list[np.ndarray | None]
    """The overlap's sensor depths (``MetricSession.overlap``), frozen with it."""
    scale: Any = None
    """Its scale pass on the next stream (``scale_pass.ScalePass``); None until it runs."""


class RolloverSession:
    """A StreamingSession that rolls over into Sim(3)-stitched sessions (module docstring)."""

    def __init__(self, session: StreamingSession, metric: MetricConfig | None = None) -> None:
        """Wrap ``session`` (``metric``: the ``metric.*`` settings; default: model units)."""
        self._session = session
        self._lock = threading.RLock()
        # The overlap is read-only at run time, so the ring's length is fixed at start.
        self._ring: collections.deque[_Keyframe] = collections.deque(
            maxlen=session.config.stream.overlap_keyframes)
        self._alignment: Sim3Alignment | None = None
        self._frames_out = 0
        self._rollover_ms: float | None = None
        self._stats = RolloverStats()
        self._prep: _Preparation | None = None
        self._prep_failed = False
        self._prepare_ms: float | None = None  # the unit that ran with the job (_advance)
        self._spare: Any = None
        """The stream of the session before: the next preparation's (no pages)."""
        # Metric scale hook (engine/session/metric_session.py): callers hand depth to ``metric``.
        self.metric = MetricSession(metric or MetricConfig(), session.config.stream
                                    .overlap_keyframes, session.config.cache.scale_frames)
        # IMU hook (engine/session/imu_session.py): the node attaches a tracker (input.imu_topic).
        self.imu = ImuSession()

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

    @property
    def lead_keyframes(self) -> int:
        """Keyframes before the limit at which the next session's preparation starts."""
        config = self.config
        return scale_units(config.cache.scale_frames, config.model.depth,
                           self._session.with_depth)

    @property
    def overlap(self) -> tuple[_Keyframe, ...]:
        """Return the keyframes kept for the next session's overlap, oldest first."""
        return tuple(self._ring)

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
        """As ``StreamingSession.step_tensor`` (:meth:`frame_job`, run, :meth:`finish_job`)."""
        with self._lock:
            job = self.frame_job(tensor, info, tag, preprocess_ms)
            return [] if job is None else self.finish_job(job, run_jobs([job])[0])

    def frame_job(self, tensor: torch.Tensor, info: PreprocessInfo, tag: FrameTag | int,
                  preprocess_ms: float = 0.0) -> FrameJob | None:
        """As ``StreamingSession.frame_job``, after the switch when one is due (it raises).

        The job's overlap work is a preparation unit: only its device time adds to the frame.
        """
        with self._lock:
            if self._due():
                self._switch()
            self._plan()
            self._prepare_ms = None
            return self._session.frame_job(tensor, info, tag, preprocess_ms,
                                           overlap=self._advance)

    def finish_job(self, job: FrameJob, outcome: Outcome) -> list[FramePrediction]:
        """As ``StreamingSession.finish_job``, the predictions stitched (module docstring)."""
        with self._lock:
            prepare_ms, self._prepare_ms = self._prepare_ms, None
            preds = self._publish(self._session.finish_job(job, outcome))
            return with_timing(preds, 'prepare', prepare_ms)

    def flush(self) -> list[FramePrediction]:
        """Run buffered scale frames now (end of a short stream)."""
        with self._lock:
            return self._publish(self._session.flush())

    def _publish(self, preds: list[FramePrediction]) -> list[FramePrediction]:
        self.metric.observe(preds)  # metric hook: before any is stitched
        self.imu.observe(preds)  # IMU hook (engine/session/imu_session.py): the same
        return [self._stitch(pred) for pred in preds]

    def reset(self) -> dict[str, int]:
        """Reset the session and the stitching: the next frame starts a new origin."""
        with self._lock:
            self._cancel_preparation()
            self._prep_failed = False
            cleared = self._session.reset()
            self._ring.clear()
            self._alignment = None
            self._frames_out = 0
            self._rollover_ms = None
            self.metric.reset()  # metric hook
            self.imu.reset()  # IMU hook
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

    # ---- preparation ------------------------------------------------------------------------

    def _plan(self) -> None:
        """Freeze the next session's overlap when due; asked before every frame (after a switch).

        A unit then runs with that frame and each after it (while it runs), so the
        frame that fills the session runs the last (K = 1; sooner with K > 1) and a session as
        short as the lead prepares from its first frame on.
        """
        stream = self.config.stream
        if (self._prep is None and len(self._ring) >= stream.overlap_keyframes
                and self._stats.session_keyframes >= stream.session_keyframes
                - self.lead_keyframes):
            self._prep = _Preparation(list(self._ring), self.metric.overlap())

    def _start_scale(self, overlap: list[_Keyframe]) -> Any:
        """Start the scale pass of ``overlap``'s first N_s frames on the spare stream."""
        stream = self._spare if self._spare is not None else self._session.stream.sibling()
        self._spare = stream  # until the pass holds it
        images = torch.stack([kf.tensor for kf in overlap[:self.config.cache.scale_frames]])
        scale = stream.scale_pass(images, self._session.with_depth)
        self._spare = None
        return scale

    def _advance(self) -> None:
        """Start or advance the preparation by one unit (its host ms: ``_prepare_ms``).

        A job's overlap work (:meth:`frame_job`). A preparation that fails is dropped (logged):
        the switch then runs the pass itself and raises what it raises, so no frame is lost.
        """
        prep = self._prep
        if prep is None or self._prep_failed or (prep.scale is not None and prep.scale.done):
            return
        try:
            if prep.scale is None:
                prep.scale = self._start_scale(prep.overlap)
            scale = prep.scale
            scale.step()
        except Exception as exc:  # noqa: BLE001 - reported, and run again at the switch
            _LOG.warning('rollover: preparing the next session failed (%s: %s); the switch '
                         'will run its scale pass', type(exc).__name__, exc)
            self._cancel_scale()
            self._prep_failed = True
            return
        self._stats.preparation = 'ready' if scale.done else 'preparing'
        self._prepare_ms = scale.step_ms

    def _cancel_scale(self) -> None:
        """Drop the preparation's scale pass (its pages back); the frozen overlap stays."""
        prep = self._prep
        if prep is not None and prep.scale is not None:
            prep.scale.cancel()
            self._spare = prep.scale.stream
            prep.scale = None
        self._stats.preparation = 'idle'

    def _cancel_preparation(self) -> None:
        self._cancel_scale()
        self._prep = None

    # ---- rollover -----------------------------------------------------------------------------

    def _due(self) -> bool:
        stream = self.config.stream
        return (self._stats.session_keyframes >= stream.session_keyframes
                and len(self._ring) >= stream.overlap_keyframes)

    def _switch(self) -> None:
        """Switch to the prepared session and align it (module docstring)."""
        start = time.perf_counter()
        old = self._session.stream
        self._plan()  # due implies planned: freezes the overlap if nothing did
        prep, self._prep = self._prep, None
        if prep.scale is None:
            # Unprepared: the ending stream's pages go back first (a pool without headroom).
            self._session.reset()
            prep.scale = self._start_scale(prep.overlap)
        left = prep.scale.run_all()
        self._session.reset()  # the ending stream's pages back to the pool
        try:
            out = prep.scale.install(old)
        except BaseException:
            self._prep = prep
            self._cancel_preparation()
            raise
        num_scale = self.config.cache.scale_frames
        overlap = prep.overlap
        preds = self._session.adopt(prep.scale.stream, [
            (kf.tensor, kf.info, kf.tag) for kf in overlap[:num_scale]], out)
        self._spare = old
        for kf in overlap[num_scale:]:
            preds += self._session.step_tensor(kf.tensor, kf.info, kf.tag)
        self._align(prep, preds)
        stats = self._stats
        stats.preparation = 'idle'
        stats.last_switch_units = left
        stats.unprepared_switches += int(left > 0)
        self._prep_failed = False
        if preds[0].network_input.is_cuda:
            torch.cuda.synchronize(preds[0].network_input.device)
        self._rollover_ms = (time.perf_counter() - start) * 1e3
        stats.last_rollover_ms = self._rollover_ms
        stats.max_rollover_ms = max(stats.max_rollover_ms, self._rollover_ms)

    def _align(self, prep: _Preparation, preds: list[FramePrediction]) -> None:
        """Fit the new session's overlap poses to the published ones; count the session."""
        overlap = prep.overlap
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
            # One host copy each (the switch waits for them; a few small maps).
            depths = (list(host_maps([kf.depth for kf in overlap])),
                      list(host_maps([p.depth for p in preds])))
        self._alignment = fit_rollover(reference, ses, previous, depths)
        # Metric hook: the session's metric scale replaces the fitted one (kept as a check).
        self.metric.start_session(preds, reference, ses, self._alignment, prep.sensors)
        self.imu.start_session(preds, reference, ses, self._alignment)  # IMU hook
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

    def _stitch(self, pred: FramePrediction) -> FramePrediction:
        """Map a session prediction into the continuous frame; remember it if it is a keyframe."""
        c2w, depth = pred.c2w, pred.depth
        alignment = self.metric.alignment(self._alignment)  # metric hook: metres when known
        if self.imu.enabled:  # IMU hook: its locked scale when the depth camera has none
            alignment = self.imu.alignment(alignment, self.metric.scale() if self.metric.enabled
                                           else None)
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
