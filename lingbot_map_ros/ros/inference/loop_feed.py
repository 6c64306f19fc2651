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
"""From the node's predictions to the mapping back end: keyframe records and the state.

:class:`LoopFeed` holds the :class:`~lingbot_map_ros.engine.mapping.backend.MappingBackend` of a
single-camera node (built once here, from the ``loop.*`` and ``map.*`` configs and the
session's engine). On the inference thread, :meth:`LoopFeed.feed` turns each keyframe's
prediction into an observation (its continuous pose, its place descriptor, its processed image);
nothing waits for the back end. The verifier is the model's (on a scratch stream of the node's
engine, paced to one unit beside at most one frame in ``loop.verify_unit_interval``), or one
given by a test.

States (the ``loop`` diagnostic status): ``off`` (``loop.enable`` false), ``unavailable`` (gtsam
missing, no depth head for the verifier, or predictions without place descriptors;
``reason`` says which), ``running``. Several cameras: no feed (``frame_pipeline.py``). With an
IMU (:meth:`LoopFeed.use_imu`) the back end adds the gyroscope's rotation factors.
"""

from __future__ import annotations

from typing import Any, Callable

from lingbot_map_ros.config import LoopConfig, MapConfig, MetricConfig, section_from_flat
from lingbot_map_ros.engine.mapping.backend import MappingBackend
from lingbot_map_ros.engine.mapping.loop_closer import LoopCloser
from lingbot_map_ros.engine.mapping.places.image_store import network_rgb
from lingbot_map_ros.engine.mapping.verify.verification import Verifier
from lingbot_map_ros.engine.optional_dependencies import missing
from lingbot_map_ros.engine.session.prediction import FramePrediction
import numpy as np


def descriptor_of_prediction(pred: FramePrediction) -> np.ndarray | None:
    """Return the model's place descriptor of a keyframe's prediction, None when it has none."""
    return getattr(pred, 'descriptor', None)


class LoopFeed:
    """Keyframes of one camera into its mapping back end (module docstring)."""

    def __init__(self, session: Any, values: dict[str, Any], logger: Any) -> None:
        """Read ``loop.*`` and ``map.*`` and build the back end when loop closure can run.

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
        self.descriptor_of: Callable[[FramePrediction], np.ndarray | None] = \
            descriptor_of_prediction
        """Where a keyframe's descriptor comes from (the prediction's; tests give an oracle)."""
        self.backend = MappingBackend(
            self.config, scale_fixed=MetricConfig.from_flat(values).enabled,
            engine=getattr(session.session, 'engine', None),
            localize_matches=MapConfig.from_flat(values).localize_matches)
        """The mapping back end: closer, verifier, pacing, loaded map, store."""
        self.num_dropped = 0
        """Keyframes the closer refused (malformed pose or descriptor)."""
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
    def closer(self) -> LoopCloser | None:
        """Return the running LoopCloser, or None."""
        return self.backend.closer

    @property
    def stamps(self) -> list[int]:
        """Stamp (ns) of each fed keyframe of the running graph, by keyframe number."""
        return self.backend.stamps

    def use_verifier(self, verifier: Verifier) -> None:
        """Verify with ``verifier`` instead of the model (before the first keyframe)."""
        self.backend.use_verifier(verifier)

    def use_imu(self, rotations: Any) -> None:
        """Constrain each keyframe's rotation by the IMU's (an ``ImuRotations``, docs/imu.md)."""
        self.backend.use_rotations(rotations)

    def feed(self, pred: FramePrediction) -> None:
        """Queue a keyframe's record (non-keyframes only pace the verification)."""
        self.backend.tick()
        if self.state != 'running' or not pred.is_keyframe:
            return
        descriptor = self.descriptor_of(pred)
        if descriptor is None:
            self._unavailable('the predictions carry no place descriptor')
            return
        rgb = network_rgb(pred.network_input) if self.config.image_store_bytes > 0 else None
        size = self._session.session.stats().image_size_hw
        try:
            self.backend.observe(pred.stamp_ns, pred.c2w, descriptor, rgb,
                                 tuple(size) if size is not None else None)
        except ImportError as exc:
            self._unavailable(str(exc))
            return
        except ValueError as exc:
            if self.backend.closer is None:  # the closer could not start: a setting
                self._unavailable(str(exc))
                return
            self.num_dropped += 1
            self._log.warning(f'keyframe not indexed for loop closure: {exc}',
                              throttle_duration_sec=10.0)
            return
        self.reason = 'ok'

    def pace(self) -> None:
        """Wait until ``loop.verify_unit_interval`` frames passed since the last unit."""
        self.backend.pace()

    def reset(self) -> None:
        """Forget the run (a session reset starts a new odom, so a new graph)."""
        self.backend.reset()
        if self.state == 'running':
            self.reason = 'waiting for keyframes'

    def close(self) -> None:
        """Stop the closer and the verifier."""
        self.backend.close()

    def _unavailable(self, reason: str) -> None:
        if self.state != 'unavailable':
            self._log.warning(f'loop closure unavailable: {reason}')
        self.state, self.reason = 'unavailable', reason
        self.backend.close()
