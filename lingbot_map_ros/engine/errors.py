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
"""The engine's typed errors: what a caller (node, replay, bench) can catch and act on."""


class LingbotMapError(Exception):
    """Base class of every error the engine raises on purpose."""


class SessionLimitError(LingbotMapError):
    """The streaming session cannot take another frame; reset it and go on."""


class TimeIndexLimitError(SessionLimitError):
    """The next keyframe's time index would pass the 3-D RoPE table (``max_frame_num``)."""


class CachePoolExhaustedError(SessionLimitError):
    """A KV page pool is full (the special stream holds ``max_total_frames`` frames)."""


class CacheStateError(LingbotMapError):
    """A cache call that does not fit the cache's state (e.g. rollback with nothing to undo)."""


class InvalidFrameError(LingbotMapError, ValueError):
    """An input image the engine cannot use (wrong shape, dtype, empty, non-finite)."""


class WeightsError(LingbotMapError):
    """A checkpoint that does not match the model (missing, unexpected or mis-shaped keys)."""


class ResolutionChangedError(SessionLimitError):
    """A frame's processed size differs from the session's; reset to start a new map."""


class NonFiniteOutputError(SessionLimitError):
    """The network produced a NaN/Inf pose; the cached state is suspect, so reset."""


class PoolExhaustedError(CachePoolExhaustedError):
    """The engine's page pool has no room for another stream's lease (``cache.pool_pages``).

    Raised before anything is written; the streams that hold pages are not touched. Ending or
    resetting another stream returns its pages.
    """


class MapLoadError(LingbotMapError, ValueError):
    """A saved map that is refused (``engine/mapping/store/map_load.py``); the message says why."""
