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
"""

from typing import Literal

Role = Literal['scale', 'keyframe', 'non-keyframe']
"""What a frame is in the streaming schedule; also the mode of a model call."""

ROLES: tuple[Role, ...] = ('scale', 'keyframe', 'non-keyframe')
"""Every role, in schedule order."""

NUM_SPECIAL_TOKENS = 6
"""Special tokens per frame, ahead of the patch tokens: camera, 4 registers, scale."""
