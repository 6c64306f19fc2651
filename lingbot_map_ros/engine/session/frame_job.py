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
"""FrameJob: one streaming frame's model call, planned by its session and run in a batch.

``StreamingSession.frame_job`` plans it (index, keyframe, time index: nothing changes yet),
``camera_batch.run_jobs`` runs the jobs of several streams as one batch, and
``StreamingSession.finish_job`` takes the output as ``step_tensor`` would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TYPE_CHECKING

from lingbot_map_ros.engine.frames import FrameTag, Role
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.engine import EngineStream


class JobSession(Protocol):
    """The session that plans a job and takes its output (``pipeline.StreamingSession``)."""

    @property
    def stream(self) -> EngineStream:
        """Return the session's stream on the engine."""


@dataclass(frozen=True)
class FrameJob:
    """One streaming frame's model call."""

    session: JobSession
    """The session that planned it and takes its output."""
    image: torch.Tensor
    """[1, 3, H, W] on the device."""
    info: PreprocessInfo
    tag: FrameTag
    preprocess_ms: float
    index: int
    """The frame's index in the session."""
    keyframe: bool
    time_index: int
    """3-D RoPE time index (keyframes the session cached so far)."""
    with_depth: bool
    with_descriptor: bool = False
    """Return the frame's place descriptor (a keyframe of a session that asks for them)."""

    @property
    def role(self) -> Role:
        """Return 'keyframe' or 'non-keyframe'."""
        return 'keyframe' if self.keyframe else 'non-keyframe'

    @property
    def stream(self) -> EngineStream:
        """Return the session's stream on the engine."""
        return self.session.stream
