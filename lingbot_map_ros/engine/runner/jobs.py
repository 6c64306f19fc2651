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
"""Job and Outcome: what the runner is asked to run and what it gives back.

A job is one call of the streaming schedule on one stream: its N_s scale frames together, or
one streaming frame. The runner (``runner.py``) takes any list of jobs of one engine; the jobs
that can share a batch (streaming frames of one size and depth setting, each on another
stream) run as one, a single frame being a batch of one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..frames import Role
from ..model.stream_state import StreamState


@dataclass(frozen=True)
class Job:
    """One call of the schedule on one stream."""

    stream: StreamState
    """The stream's caches, read and written."""
    images: torch.Tensor
    """[S, 3, H, W] in [0, 1] on the engine's device: S = N_s for 'scale', else 1."""
    time_index: int
    """3-D RoPE time of the first frame (keyframes the stream cached so far)."""
    mode: Role
    """'scale', 'keyframe' or 'non-keyframe'."""
    with_depth: bool = False
    with_descriptor: bool = False
    """Return the frames' place descriptors."""
    return_taps: bool = False
    """Return the aggregator's taps and DINO tokens (tests, the model verifier)."""


@dataclass(frozen=True)
class Outcome:
    """What a job gave: the model's output (or the error that refused it) and its batch."""

    out: dict | Exception
    """As ``LingbotMapModel.forward`` returns for the job's frames, or the job's error."""
    model_ms: float
    """Host time of the batch the job ran in, device work included (0 for a refused job)."""
    batch_size: int
    """Jobs that ran in that batch (1: alone)."""
