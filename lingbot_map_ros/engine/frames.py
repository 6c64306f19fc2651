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
"""Frame vocabulary shared by the model, the heads, the session and its predictions.

A call of the streaming schedule runs frames in one of three roles (model spec 5.3):
``'scale'`` (phase 1: the N_s scale frames together), ``'keyframe'`` (cached) and
``'non-keyframe'`` (attends to the cache, then discarded). Every frame carries
``NUM_SPECIAL_TOKENS`` learned tokens ahead of its patch tokens: [camera, register x 4, scale].

An input frame carries one :class:`FrameTag` from the caller (the node, the replay) through the
feeder and the sessions into its prediction, so nobody keeps tables keyed by stamp to find out
whose prediction came back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal['scale', 'keyframe', 'non-keyframe']
"""What a frame is in the streaming schedule; also the mode of a model call."""

ROLES: tuple[Role, ...] = ('scale', 'keyframe', 'non-keyframe')
"""Every role, in schedule order."""

NUM_SPECIAL_TOKENS = 6
"""Special tokens per frame, ahead of the patch tokens: camera, 4 registers, scale."""


@dataclass(frozen=True, slots=True)
class FrameTag:
    """The identity of one input frame: given with the frame, returned on its prediction.

    The engine reads only ``stamp_ns``; the rest is the caller's and comes back unchanged.
    """

    stamp_ns: int
    """The frame's timestamp in nanoseconds (the stamp checks and the outputs use it)."""
    frame_id: str = ''
    """The caller's frame of the image (the node: the camera optical frame of the outputs)."""
    received_s: float | None = None
    """``time.monotonic()`` when the caller received the frame (end-to-end latency), if known."""


def frame_tag(tag: FrameTag | int) -> FrameTag:
    """Return ``tag``, or a tag with only a stamp for a plain integer stamp (tools, tests)."""
    return tag if isinstance(tag, FrameTag) else FrameTag(int(tag))
