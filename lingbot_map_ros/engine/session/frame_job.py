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
"""FrameJob: one model call of a session, planned by it, run by its engine, taken back by it.

Every frame a session runs goes the same way, alone or beside other streams' frames:
``StreamingSession.frame_job`` plans the call (the N_s scale frames together, or one streaming
frame: index, role, time index; the counters do not move yet), :func:`run_jobs` runs the jobs
of each engine through ``Engine.run`` (a single frame is a batch of one), and
``StreamingSession.finish_job`` turns the outcome into predictions, or raises its error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
import functools
from typing import Protocol, TYPE_CHECKING

from lingbot_map_ros.engine.frames import FrameTag, Role
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
from lingbot_map_ros.engine.runner.jobs import Job, Outcome
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
    """One model call of a session: its scale frames together, or one streaming frame."""

    session: JobSession
    """The session that planned it and takes its output."""
    images: torch.Tensor
    """[S, 3, H, W] on the device: S = the scale frames for 'scale', else 1."""
    frames: tuple[tuple[PreprocessInfo, FrameTag], ...]
    """Per image, how it relates to its camera image, and its tag."""
    preprocess_ms: float
    """Preprocessing time of the frame that made the call."""
    index: int
    """The first frame's index in the session."""
    role: Role
    time_index: int
    """3-D RoPE time index of the first frame (keyframes the session cached so far)."""
    with_depth: bool
    with_descriptor: bool = False
    """Return the place descriptors (a keyframe or scale phase of a session that asks)."""
    generation: int = 0
    """The session's reset count when planned: a job outlives no reset."""
    overlap: Callable[[], None] | None = None
    """Host work to run while the call runs on the device (``Engine.run``'s ``overlap``)."""

    @property
    def keyframe(self) -> bool:
        """Whether the frames are cached (scale frames and keyframes)."""
        return self.role != 'non-keyframe'

    @property
    def tag(self) -> FrameTag:
        """Return the tag of the frame that made the call (the last one)."""
        return self.frames[-1][1]

    @property
    def stream(self) -> EngineStream:
        """Return the session's stream on the engine."""
        return self.session.stream

    @property
    def call(self) -> Job:
        """Return the runner's job: this call on the session's stream."""
        return Job(self.stream.state, self.images, self.time_index, self.role,
                   self.with_depth, self.with_descriptor)


def run_jobs(jobs: Sequence[FrameJob]) -> list[Outcome]:
    """Run planned jobs, one ``Engine.run`` per engine (each job on another stream).

    Each engine runs its jobs' overlap work, in the jobs' order, while their calls run.

    Returns:
        Per job, its outcome (a refused job's error does not disturb the others).
    """
    outcomes: list[Outcome | None] = [None] * len(jobs)
    groups: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(id(job.stream.engine), []).append(i)
    for members in groups.values():
        group = [jobs[i] for i in members]
        overlaps = [job.overlap for job in group if job.overlap is not None]
        ran = group[0].stream.engine.run([job.call for job in group],
                                         functools.partial(_run_all, overlaps) if overlaps
                                         else None)
        for i, outcome in zip(members, ran):
            outcomes[i] = outcome
    return outcomes  # type: ignore[return-value]


def _run_all(works: list[Callable[[], None]]) -> None:
    for work in works:
        work()
