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
"""From the node's predictions to the loop closer: keyframe records, the verifier, the state.

:class:`LoopFeed` owns the :class:`~lingbot_map_ros.engine.loop.loop_closer.LoopCloser` of a
single-camera node. On the inference thread, :meth:`LoopFeed.feed` turns each keyframe's
prediction into a record (its continuous pose, its place descriptor, its processed image) and
queues it; nothing waits for the closer. The verifier is the model's
(:class:`~lingbot_map_ros.engine.loop.model_verifier.ModelVerifier`, on a scratch stream of the
node's engine, paced to one unit beside at most one frame in ``loop.verify_unit_interval``),
or one given by a test.

States (the ``loop`` diagnostic status): ``off`` (``loop.enable`` false), ``unavailable`` (gtsam
missing, no depth head for the verifier, or predictions without place descriptors;
``reason`` says which), ``running``. Several cameras: no feed (``frame_pipeline.py``).
"""

from __future__ import annotations

from typing import Any, Callable

from lingbot_map_ros.config import LoopConfig, MetricConfig, section_from_flat
from lingbot_map_ros.engine.loop.dependencies import missing
from lingbot_map_ros.engine.loop.frame_pace import FramePace
from lingbot_map_ros.engine.loop.image_store import network_rgb
from lingbot_map_ros.engine.loop.verification import KeyframeRecord, Verifier
from lingbot_map_ros.engine.session.prediction import FramePrediction
import numpy as np

PACE_TIMEOUT_S = 0.2
"""Longest wait of a verification unit for the next frame (frames may stop coming)."""


def descriptor_of_prediction(pred: FramePrediction) -> np.ndarray | None:
    """Return the model's place descriptor of a keyframe's prediction, None when it has none."""
    return getattr(pred, 'descriptor', None)


class LoopFeed:
    """Keyframes of one camera into a LoopCloser (module docstring)."""

    def __init__(self, session: Any, values: dict[str, Any], logger: Any) -> None:
        """Read ``loop.*`` and start the closer when loop closure can run.

        Args:
            session: the node's ``RolloverSession`` (its engine runs the verification).
            values: parameter values.
            logger: the node's logger.

        Raises:
            ValueError: a bad ``loop.*`` value.
        """
        self.config: LoopConfig = section_from_flat(LoopConfig, 'loop', values)
        self._session = session
        self._log = logger
        self._scale_fixed = MetricConfig.from_flat(values).enabled
        self.descriptor_of: Callable[[FramePrediction], np.ndarray | None] = \
            descriptor_of_prediction
        """Where a keyframe's descriptor comes from (the prediction's; tests give an oracle)."""
        self._verifier: Verifier | None = None
        self._owns_verifier = False
        self._closer: Any = None
        self.map_source: Any = None
        """The loaded map every closer starts from (``map_reuse.MapReuse``), or None."""
        self._next_index = 0
        self.stamps: list[int] = []
        """Stamp (ns) of each fed keyframe, by keyframe number."""
        self.num_dropped = 0
        """Keyframes the closer refused (malformed pose or descriptor)."""
        self.frame_pace = FramePace(PACE_TIMEOUT_S, self.config.verify_unit_interval)
        """Served frames, and when the verification's next unit may run (:meth:`pace`)."""
        self.state, self.reason = 'off', 'loop.enable is false'
        if not self.config.enable:
            return
        problem = missing()
        if problem:
            self._unavailable(problem)
            return
        if hasattr(session.session, 'place_descriptors'):
            session.session.place_descriptors = True
        engine = getattr(session.session, 'engine', None)
        if engine is not None:
            # Room in the pool for one check's scale pass beside the rollover's preparation,
            # so that neither waits for the other (the pool is built at the first frame).
            engine.check_frames = max(engine.check_frames, 2 * self.config.verify_frames)
        self.state, self.reason = 'running', 'waiting for keyframes'

    @property
    def closer(self) -> Any:
        """Return the running LoopCloser, or None."""
        return self._closer

    def use_verifier(self, verifier: Verifier) -> None:
        """Verify with ``verifier`` instead of the model (before the first keyframe)."""
        self._verifier = verifier
        self._owns_verifier = False

    def feed(self, pred: FramePrediction) -> None:
        """Queue a keyframe's record (non-keyframes only pace the verification)."""
        self.frame_pace.tick()
        if self.map_source is not None and self.map_source.take_restart():
            self.reset()  # a map was loaded or a localization asked for: a new closer
        if self.state != 'running' or not pred.is_keyframe:
            return
        descriptor = self.descriptor_of(pred)
        if descriptor is None:
            self._unavailable('the predictions carry no place descriptor')
            return
        if self._closer is None and not self._start():
            return
        record = KeyframeRecord(index=self._next_index, stamp_ns=pred.stamp_ns,
                                odom_pose=np.asarray(pred.c2w, np.float64),
                                descriptor=np.asarray(descriptor, np.float32))
        rgb = network_rgb(pred.network_input) if self.config.image_store_bytes > 0 else None
        try:
            self._closer.add_keyframe(record, rgb)
        except ValueError as exc:
            self.num_dropped += 1
            self._log.warning(f'keyframe not indexed for loop closure: {exc}',
                              throttle_duration_sec=10.0)
            return
        self._next_index += 1
        self.stamps.append(pred.stamp_ns)
        self.reason = 'ok'

    def pace(self) -> None:
        """Wait until ``loop.verify_unit_interval`` frames passed since the last unit.

        Called by the verifier's worker before each unit; without frames for
        :data:`PACE_TIMEOUT_S` (a stopped camera) the unit runs anyway.
        """
        self.frame_pace()

    def reset(self) -> None:
        """Forget the run (a session reset starts a new odom, so a new graph)."""
        self._stop()
        self._next_index = 0
        self.stamps = []
        if self.state == 'running':
            self.reason = 'waiting for keyframes'

    def close(self) -> None:
        """Stop the closer and the verifier."""
        self._stop()

    def _start(self) -> bool:
        from lingbot_map_ros.engine.loop.loop_closer import LoopCloser
        verifier = self._verifier
        try:
            if verifier is None:
                verifier = self._model_verifier()
            seed = self.map_source.seed_for(self._session) if self.map_source else {}
            self._closer = LoopCloser(verifier, self.config, scale_fixed=self._scale_fixed,
                                      **seed)
        except (ImportError, ValueError) as exc:
            self._unavailable(str(exc))
            return False
        return True

    def _model_verifier(self) -> Verifier:
        from lingbot_map_ros.engine.loop.model_verifier import ModelVerifier, VerifierConfig
        cfg = self.config
        config = VerifierConfig(frames_per_side=cfg.verify_frames,
                                min_inlier_fraction=min(cfg.min_inlier_fraction, 0.999),
                                inlier_threshold=cfg.inlier_threshold,
                                scale_fixed=self._scale_fixed)
        self._verifier = ModelVerifier(self._session.session.engine, config,
                                       lookup=lambda i: self._closer.lookup(i), pace=self.pace)
        self._owns_verifier = True
        return self._verifier

    def _stop(self) -> None:
        if self._closer is not None:
            self._closer.close()
            self._closer = None
        if self._owns_verifier:
            self._verifier.close()
            self._verifier, self._owns_verifier = None, False

    def _unavailable(self, reason: str) -> None:
        if self.state != 'unavailable':
            self._log.warning(f'loop closure unavailable: {reason}')
        self.state, self.reason = 'unavailable', reason
        self._stop()
