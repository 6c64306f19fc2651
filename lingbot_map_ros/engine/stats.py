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
"""Typed statistics the engine hands to its callers (ROS diagnostics, benchmarks, tools).

Field names are the keys the diagnostics publish. A value that does not exist yet (no cache
before the first frame, no processed size before it either) is None; renderers show it as such
rather than leaving the key out, so every status has the same keys in every state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

FALLBACK_KINDS: tuple[str, ...] = ('attention_kernel', 'backend_refused', 'camera_head',
                                   'capture', 'compile', 'depth_head', 'dino_trunk',
                                   'whole_frame')
"""The fast path's step-downs, each counted under its own name (``runner/fast_path.py`` says
what each turns off); the diagnostics publish them as ``fallbacks.<kind>``."""


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Occupancy of a stream's global KV cache, of its camera-head cache and of the pool."""

    frame_count: int
    """Frames in the special stream (scale frames + cached keyframes)."""
    scale_pages: int
    """Patch pages of the scale frames (pinned)."""
    live_pages: int
    """Patch pages of the sliding window."""
    free_pages: int
    """Free patch pages."""
    special_tokens: int
    """Cached special tokens (6 per frame)."""
    special_pages: int
    """Pages of the special stream in use."""
    free_special_pages: int
    """Free pages of the special stream."""
    visible_tokens: int
    """Keys a frame attends to now."""
    contiguous: bool
    """Whether the visible pages are one run (the fast attention path)."""
    page_size: int
    """Tokens per page (one frame's patches)."""
    num_patch_pages: int
    """Patch pages allocated (N_s + W + 1)."""
    num_special_pages: int
    """Special-stream pages allocated."""
    max_total_frames: int
    """Capacity of the special stream, in frames."""
    remaining_frames: int
    """Keyframes that still fit."""
    kv_bytes: int
    """K/V bytes allocated, all blocks."""
    kv_bytes_used: int
    """K/V bytes of the visible pages, all blocks."""
    backend: str
    """Attention backend: 'flashinfer', 'sdpa', 'reference', 'triton' or 'fa3' ('auto'
    resolved)."""
    dtype: str
    """K/V storage dtype."""
    camera_frames: int
    """Frames in the camera-head cache."""
    camera_bytes: int
    """Bytes allocated by the camera-head cache."""
    pool_pages_total: int = 0
    """Pages of the engine's KV page pool (per layer), every stream's included."""
    pool_pages_free: int = 0
    """Pool pages no stream holds."""
    pool_streams: int = 0
    """Streams holding pages of the pool."""
    precision: str = 'faithful'
    """``cache.precision`` in effect: 'faithful' or 'fast_approximate' (outside the fidelity
    gate, docs/performance.md)."""
    kernel: str = ''
    """``cache.kernel`` in effect (the attention kernels' tuning), every field as
    ``name=value``, comma-separated (``KernelConfig.summary``)."""

    @classmethod
    def from_manager(cls, cache: dict[str, Any], camera_frames: int,
                     camera_bytes: int) -> CacheStats:
        """Build from ``get_cache_stats()`` (``StreamKV.stats()``) and the camera head's."""
        return cls(**cache, camera_frames=camera_frames, camera_bytes=camera_bytes)


@dataclass(frozen=True, slots=True)
class SessionStats:
    """What ``StreamingSession.stats()`` reports: counters, configuration in effect, memory."""

    frames_in: int
    """Frames taken since the last reset (buffered scale frames included)."""
    frames_out: int
    """Predictions made since the last reset."""
    keyframes: int
    """Frames cached (scale frames included)."""
    time_index: int
    """RoPE time index of the next keyframe."""
    pending_frames: int
    """Scale frames buffered, not run yet."""
    max_time_index: int
    """Ceiling of the time index (``model.max_frame_num``)."""
    cache: CacheStats | None
    """The caches; None before the first frame builds them."""
    backend: str
    """Configured attention backend."""
    device: str
    """Torch device."""
    dtype: str
    """Compute dtype of the aggregator."""
    weights: str
    """Checkpoint path, or 'random (seed N)'."""
    model_preset: str
    """'official' or 'tiny'."""
    image_size_hw: tuple[int, int] | None
    """Processed frame size; None until the first frame."""
    fast_path: str
    """Streaming frames run 'eager', as 'segments' or as 'whole_frame' graphs (in effect)."""
    cuda_graphs: bool
    """CUDA graphs in effect (off after a failed capture)."""
    compiled: bool
    """``torch.compile`` in effect (off after a failed compilation)."""
    whole_frame_graphs: bool
    """Streaming frames run as whole frames now."""
    fast_path_fallbacks: int
    """Times the fast path stepped down since start (each kind is logged once)."""
    gpu_memory_allocated_bytes: int
    """``torch.cuda.memory_allocated`` (0 on the CPU)."""
    gpu_memory_reserved_bytes: int
    """``torch.cuda.memory_reserved`` (0 on the CPU)."""
    fast_path_requested: str = 'eager'
    """The mode asked for (``stream.fast_path``; 'eager' on the CPU without compile)."""
    fast_path_reason: str = ''
    """Why the fast path in effect is below the one asked for ('' when it is not)."""
    fallbacks: dict[str, int] = field(default_factory=dict)
    """``fast_path_fallbacks`` by kind (:data:`FALLBACK_KINDS`, every kind listed)."""


@dataclass
class RolloverStats:
    """Counters of the rollover layer, all present from the start."""

    sessions: int = 1
    """Engine sessions since start (rollovers and resets each start one)."""
    rollovers: int = 0
    """Rollovers since start."""
    session_keyframes: int = 0
    """Age of the current session, in keyframes (overlap included)."""
    last_scale: float = 1.0
    """Scale of the last alignment (new session -> continuous frame)."""
    last_residual: float = 0.0
    """RMS centre error of the last alignment (continuous units)."""
    last_degenerate: bool = False
    """The last alignment could not observe scale and kept the previous one."""
    degenerate_alignments: int = 0
    """Alignments that could not observe scale and kept the previous one."""
    rejected_scales: int = 0
    """Alignments whose scale change was implausible (``stitching.MAX_SCALE_CHANGE``) and kept
    the previous scale."""
    last_rejected_scale: float | None = None
    """The scale the last alignment refused, None when it took its fit."""
    last_rollover_ms: float = 0.0
    """Extra time the last rollover added to its frame: the switch latency (what was left of
    the next session's scale pass, the page copy and the fit; docs/odometry.md)."""
    max_rollover_ms: float = 0.0
    """Largest such time so far."""
    preparation: str = 'idle'
    """The next session: 'idle' (not started), 'preparing' (its scale pass runs a unit with
    each frame) or 'ready' (the switch has nothing left to compute)."""
    last_switch_units: int = 0
    """Units of the scale pass the last switch still had to run (0: fully prepared)."""
    unprepared_switches: int = 0
    """Switches that found the next session not fully prepared (a short session, a pool
    without headroom, a flush): they ran the rest of the scale pass at the switch."""


CACHE_STATS_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CacheStats))
"""Names of :class:`CacheStats`' fields, in order."""
POOL_STATS_FIELDS: tuple[str, ...] = ('pool_pages_total', 'pool_pages_free', 'pool_streams')
"""The page pool's fields of :class:`CacheStats` (numbers in every state: 0 before a pool)."""
SESSION_STATS_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(SessionStats))
"""Names of :class:`SessionStats`' fields, in order."""
