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
"""StreamState: what one stream keeps between the model's calls, handed to the model per call.

The model (``gct.py``) holds weights only; a stream's state is its KV cache on the engine's page
pool (``cache/stream_kv.py``: lease, page table, frame plan) and its camera-head K/V cache. Two
streams of one engine (two cameras, or a session and its rollover successor) each own one and
take turns on the same model, weights loaded once.
"""

from __future__ import annotations

from dataclasses import dataclass

from .heads.camera_head import CameraKVCache
from ..cache.stream_kv import StreamKV


@dataclass
class StreamState:
    """One stream's caches."""

    camera: CameraKVCache
    """The camera head's K/V of this stream's cached frames."""
    kv: StreamKV | None = None
    """The global blocks' KV cache: pages leased from the engine's pool at the stream's first
    frame of a size; None before it and after the pages are returned."""
