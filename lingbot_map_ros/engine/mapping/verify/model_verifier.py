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
"""ModelVerifier: a loop candidate checked by a short joint pass of the model itself.

The pass. The candidate keyframe, the query keyframe and up to ``frames_per_side - 1``
nearest stored keyframes of each (``lookup``) run together as one scale pass: the first
frames of a session attend to each other in both directions, so the camera head places all
of them in one frame (the candidate's camera, the pass's frame 0) and the DPT head gives each
its depth and confidence. This is the machinery of a rollover's preparation
(``engine/scale_pass.ScalePass``) on a scratch stream of the engine: the pass writes its
K/V to a small lease of the pool's headroom and reads no cache; it is never installed, and
its pages go back when it ends. The live stream's pages and counters are not touched.

Never stalling the stream. The pass is a sequence of units (each scale frame's DINO trunk,
each block pair, the camera head, each frame's DPT head), each run under the engine's lock on
the same device stream as the frames. :meth:`ModelVerifier.start` returns the pass as a
:class:`VerificationPass` whose :meth:`~VerificationPass.step` runs one unit: call it from a
frame's ``overlap`` hook, as the rollover does, or let :meth:`ModelVerifier.verify` (the
``Verifier`` protocol, on the loop closer's worker thread) run the units, calling ``pace``
before each: a pace that waits for served frames (``frame_pace.FramePace``) keeps it to one unit
beside at most one frame in every N (``loop.verify_unit_interval``). At most one pass is in
flight; another ``start`` meanwhile is answered 'busy'.

The check (``view_agreement.py``): the query's confident depth points, moved into the
candidate's camera by the camera head's relative pose, must land on the candidate's depth
(projective association, a robust similarity fit, one more association under the fit): the
inlier share and the residual gate the pair, and the fit must not stray from the camera
head's pose.

Scale and the answer (``pass_verdict.py``): each side's keyframes, seen by the odometry and
by the pass, give the factor from the pass's units to the odometry's; the relative Sim(3) is
the fitted pose in those units (SE(3) with ``scale_fixed``).
"""

from __future__ import annotations

from collections.abc import Callable
import io
import logging
import threading
import time
from typing import TYPE_CHECKING

from lingbot_map_ros.engine.errors import (InvalidFrameError, LingbotMapError, PoolExhaustedError,
                                           ResolutionChangedError)
from lingbot_map_ros.engine.image.preprocess import preprocess_image
from lingbot_map_ros.engine.mapping.verify.frame_pace import FramePace  # noqa: F401 - re-exported
from lingbot_map_ros.engine.mapping.verify.pass_verdict import (rejected, Sides, verdict,
                                                                VerifierConfig)
from lingbot_map_ros.engine.mapping.verify.verification import KeyframeRecord, Verification
import numpy as np
from PIL import Image
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.engine import Engine, EngineStream
    from lingbot_map_ros.engine.scale_pass import ScalePass

_LOG = logging.getLogger(__name__)


def decode_rgb(jpeg: bytes | None) -> np.ndarray | None:
    """Decode a keyframe's stored image to ``[H, W, 3]`` uint8 RGB; None when it cannot be."""
    if not jpeg:
        return None
    try:
        with Image.open(io.BytesIO(jpeg)) as image:
            return np.asarray(image.convert('RGB'))
    except (OSError, ValueError, Image.DecompressionBombError):
        return None


class VerificationPass:
    """One joint pass and its check, advanced one unit at a time (module docstring)."""

    def __init__(self, verifier: ModelVerifier, query: KeyframeRecord,
                 candidate: KeyframeRecord, refused: str | None = None) -> None:
        """Decode the frames and start the pass; a pair that cannot start is done at once.

        ``refused`` answers at once with that reason, without touching the verifier.
        """
        self._verifier = verifier
        self.query, self.candidate = query, candidate
        self.unit_ms: list[float] = []
        """Host milliseconds of each unit run so far (launches on CUDA)."""
        self._scale: ScalePass | None = None
        self._result: Verification | None = None
        self._sides: Sides = ([], [])
        if refused is not None:
            self._result = rejected(refused)
            return
        try:
            self._start()
        except LingbotMapError as exc:
            reason = ('pool_busy' if isinstance(exc, PoolExhaustedError)
                      else 'size_mismatch' if isinstance(exc, ResolutionChangedError)
                      else 'bad_image' if isinstance(exc, InvalidFrameError) else 'engine')
            _LOG.info('loop check %d -> %d not run (%s): %s', query.index, candidate.index,
                      reason, exc)
            self._finish(rejected(reason))

    @property
    def units(self) -> int:
        """Units of the whole pass (0 when it could not start)."""
        return 0 if self._scale is None else self._scale.units

    @property
    def outputs(self) -> dict | None:
        """Return what the joint pass's heads gave once every unit ran, else None."""
        return None if self._scale is None else self._scale.outputs

    @property
    def done(self) -> bool:
        """Whether every unit ran (the result is then ready)."""
        return self._result is not None or (self._scale is not None and self._scale.done)

    def step(self) -> None:
        """Run the next unit of the pass (nothing once done)."""
        if self._scale is None or self._scale.done:
            return
        self._scale.step()
        self.unit_ms.append(self._scale.step_ms)

    def result(self) -> Verification:
        """Run what is left, check the views, give the pages back; the answer (once)."""
        if self._result is None:
            scale = self._scale
            try:
                scale.run_all()
                answer = verdict(self._verifier.config, self._sides, scale.outputs)
            finally:
                self._release()
            self._finish(answer)
        return self._result

    def cancel(self) -> None:
        """Drop the pass: its pages back, answered 'cancelled'."""
        if self._result is None:
            self._release()
            self._finish(rejected('cancelled'))

    def _start(self) -> None:
        verifier = self._verifier
        sides = verifier.sides(self.query, self.candidate)
        images = []
        for record in (*sides[0], *sides[1]):
            rgb = decode_rgb(record.image)
            if rgb is None:
                self._finish(rejected('bad_image'))
                return
            images.append(preprocess_image(rgb, verifier.image_width, verifier.patch_size)[0])
        if len({tuple(t.shape) for t in images}) != 1:
            self._finish(rejected('bad_image'))
            return
        self._sides = sides
        batch = torch.stack(images).to(verifier.engine.device)
        self._scale = verifier.stream.scale_pass(batch, with_depth=True)

    def _release(self) -> None:
        if self._scale is not None:
            # The pool's bookkeeping is serialised by the engine's lock (the frames lease too).
            with self._verifier.engine.lock:
                self._scale.cancel()

    def _finish(self, verdict: Verification) -> None:
        self._result = verdict
        self._verifier.finished(self)


class ModelVerifier:
    """Implements ``verification.Verifier`` with the engine's model (module docstring)."""

    def __init__(self, engine: Engine, config: VerifierConfig = VerifierConfig(), *,
                 lookup: Callable[[int], KeyframeRecord | None] | None = None,
                 pace: Callable[[], object] | None = None) -> None:
        """Check pairs on ``engine``'s model and pool.

        Args:
            engine: the engine the live streams run on (its model needs a depth head).
            config: thresholds and sizes.
            lookup: a stored keyframe by index, None where there is none (the loop closer's
                store): each side's neighbours. Without it a side is its keyframe alone.
            pace: called before each unit by :meth:`verify` (e.g. a ``FramePace``).

        Raises:
            ValueError: the model has no depth head, or the pass would not fit the scale
                phase (``2 * frames_per_side > cache.scale_frames``).
        """
        if engine.model.depth_head is None:
            raise ValueError('ModelVerifier needs the depth head (model.enable_depth)')
        num_scale = engine.config.cache.scale_frames
        if 2 * config.frames_per_side > num_scale:
            raise ValueError(f'frames_per_side={config.frames_per_side}: the pass of '
                             f'{2 * config.frames_per_side} frames must fit the '
                             f'cache.scale_frames={num_scale} frames of a scale phase')
        self.engine = engine
        self.config = config
        self.image_width = engine.config.stream.image_width
        self.patch_size = engine.config.model.patch_size
        self._lookup = lookup
        self._pace = pace
        self._stream: EngineStream | None = None
        self._busy = False
        self._lock = threading.Lock()

    @property
    def stream(self) -> EngineStream:
        """Return the scratch stream the passes run on (opened at the first pass)."""
        if self._stream is None:
            self._stream = self.engine.open_stream()
        return self._stream

    @property
    def in_flight(self) -> bool:
        """Whether a pass has started and not ended."""
        return self._busy

    def start(self, query: KeyframeRecord, candidate: KeyframeRecord) -> VerificationPass:
        """Start the pass of a pair; run it with ``step`` / ``result`` (module docstring).

        While another pass is in flight the returned pass is done at once, 'busy'.
        """
        with self._lock:
            if self._busy:
                return VerificationPass(self, query, candidate, refused='busy')
            self._busy = True
        try:
            return VerificationPass(self, query, candidate)
        except BaseException:
            self._busy = False
            raise

    def warm_up(self, size_hw: tuple[int, int]) -> None:
        """Run one throw-away pass on grey frames of processed size ``size_hw``, now.

        Builds what a pass builds at first use where the fast path captures (the depth head's
        step, when the live frames run without depth), so that no capture lands beside a
        live frame later. Call it after the engine's own warm-up for that size (the stream's
        first frame), between frames. Pages and caches are as before afterwards.

        Raises:
            PoolExhaustedError: no room in the pool's headroom now.
            RuntimeError: a pass is in flight.
        """
        with self._lock:
            if self._busy:
                raise RuntimeError('warm_up: a verification pass is in flight')
            self._busy = True
        try:
            frames = 2 * self.config.frames_per_side
            images = torch.full((frames, 3, *size_hw), 0.5, device=self.engine.device)
            scale = self.stream.scale_pass(images, with_depth=True)
            try:
                scale.run_all()
            finally:
                with self.engine.lock:
                    scale.cancel()
        finally:
            with self._lock:
                self._busy = False

    def verify(self, query: KeyframeRecord, candidate: KeyframeRecord) -> Verification:
        """Run the whole check of a pair here, a unit at a time (``Verifier`` protocol)."""
        verification = self.start(query, candidate)
        while not verification.done:
            if self._pace is not None:
                self._pace()
            verification.step()
        return verification.result()

    def close(self) -> None:
        """End the scratch stream (its camera cache freed); cancel a pass first."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    # ---- for VerificationPass ---------------------------------------------------------------

    def finished(self, verification: VerificationPass) -> None:
        """Take note that the pass in flight ended (its pages are back)."""
        with self._lock:
            self._busy = False

    def sides(self, query: KeyframeRecord, candidate: KeyframeRecord) -> Sides:
        """Return the pass's frames: (candidate, its neighbours), (query, its neighbours)."""
        per_side = self.config.frames_per_side
        taken = {query.index, candidate.index}
        sides: Sides = ([candidate], [query])
        for side, centre in zip(sides, (candidate.index, query.index)):
            for offset in range(1, 4 * per_side):
                if len(side) >= per_side or self._lookup is None:
                    break
                for index in (centre - offset, centre + offset):
                    record = None if index in taken else self._lookup(index)
                    if len(side) < per_side and record is not None and record.image:
                        side.append(record)
                        taken.add(index)
        return sides


def time_verification(verifier: ModelVerifier, query: KeyframeRecord,
                      candidate: KeyframeRecord) -> tuple[Verification, list[float], float]:
    """Run one check unit by unit, timing each (benchmarks: ``tools/bench_loop.py``).

    Returns:
        ``(answer, per-unit milliseconds including the device, whole-check milliseconds)``.
    """
    device = verifier.engine.device

    def sync() -> None:
        if device.type == 'cuda':
            torch.cuda.synchronize(device)

    sync()
    start = time.perf_counter()
    verification = verifier.start(query, candidate)
    unit_ms = []
    while not verification.done:
        unit_start = time.perf_counter()
        verification.step()
        sync()
        unit_ms.append((time.perf_counter() - unit_start) * 1e3)
    answer = verification.result()
    sync()
    return answer, unit_ms, (time.perf_counter() - start) * 1e3
