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
"""Camera head: iterative AdaLN refinement of the camera token, causal over frames.

Spec §6.1 (architecture) and §5.6 (cache).

Dims: S frames in one call, C = 2 * embed_dim channels, I = ``num_iterations``, J = trunk blocks,
heads x D = C.

Per call, with ``c = token_norm(camera token of the last tap)`` [S, C] and for it = 0..I-1:

- ``u = embed_pose(empty_pose_tokens)`` at it = 0, else ``embed_pose(p_raw.detach())``;
- ``(shift, scale, gate) = poseLN_modulation(u)`` (SiLU, then Linear C -> 3C; chunked in that
  order);
- ``x = gate * (LN0(c) * (1 + scale) + shift) + c`` (LN0: no affine, eps 1e-6);
- ``x = trunk(x)`` (J blocks: eps 1e-5, no QK-norm, no RoPE; attention over frames, see below);
- ``p_raw += pose_branch(trunk_norm(x))`` (``p_raw = delta`` at it = 0);
- output of the iteration: ``[p_raw[:7], ReLU(p_raw[7:9])]`` = ``[t(3), q_xyzw(4), fov_h, fov_w]``.

The trunk attends across *frames*: each frame contributes one token. Every (iteration, block) has
its own K/V cache of camera tokens, float (the parameters' dtype), never evicted:

- ``'scale'``: the S scale frames attend bidirectionally to each other, then stay cached. The
  cache must be empty (start of a session).
- ``'keyframe'`` (S = 1): the frame's K/V is appended, then it attends over every cached frame.
- ``'non-keyframe'`` (S = 1): it attends over the cached frames plus itself; nothing is kept.

Special (better than the official cache, same numbers): K/V live in one preallocated buffer that
grows geometrically (amortised O(1) per frame instead of re-concatenating and cloning the whole
cache every frame). The new frame's K/V are written in place into the next free slot, and the
frame-count only advances after the whole call succeeds, so a non-keyframe (or a failed call)
leaves the cache as it was. Cached K/V are detached: the head is for inference. It runs with
autocast disabled, in its parameters' dtype (float32 unless converted): the 4-iteration loop
amplifies low-precision noise into the pose.

Precision (``stream.camera_head_dtype``, :meth:`CameraHead.set_compute_dtype`): the trunk and
``poseLN_modulation`` may hold bf16 weights. A streaming frame is one token, so every linear is a
GEMV whose cost is reading its weights: ~0.86 GB per iteration in float32, 3.4 GB per frame
(I = 4); bf16 halves the bytes (docs/performance.md, 'Camera head precision'). The stream
``x``, the LayerNorms (float32 always, ``layers/norm.py``), ``embed_pose``, ``pose_branch`` and
``p_raw`` stay float32; only the products and the camera K/V cache run in bf16.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lingbot_map_ros.config import ModelConfig
import torch
from torch import nn
import torch.nn.functional as F

from ..layers import Attend, Block, Mlp
from ...errors import CacheStateError
from ...frames import Role

POSE_DIM = 9
"""Pose encoding width: translation(3), quaternion xyzw(4), fov_h, fov_w."""


@dataclass(frozen=True, slots=True)
class CameraCacheStats:
    """Size of the camera-head K/V cache, for diagnostics."""

    num_frames: int
    """Frames cached (scale frames + keyframes since the last reset)."""
    capacity_frames: int
    """Frames the allocated buffer holds before it has to grow."""
    used_bytes: int
    """Bytes holding cached K/V (I * J * 2 * C * itemsize per frame)."""
    allocated_bytes: int
    """Bytes of the allocated buffer."""


class CameraKVCache:
    """K/V of camera tokens for every (iteration, block); one shared frame count.

    Layout ``[I, J, 2 (K/V), heads, capacity, D]``: the cached keys of one head are contiguous.
    """

    def __init__(self, num_iterations: int, num_blocks: int, num_heads: int, head_dim: int,
                 min_capacity: int = 16) -> None:
        """Describe the cache; no memory is allocated until the first frame.

        Args:
            num_iterations: I.
            num_blocks: J.
            num_heads: heads of the trunk attention.
            head_dim: D.
            min_capacity: frames of the first allocation.
        """
        self._dims = (num_iterations, num_blocks, 2, num_heads)
        self._head_dim = head_dim
        self._min_capacity = max(1, min_capacity)
        self._buffer: torch.Tensor | None = None
        self.num_frames = 0
        self.generation = 0
        """Counts buffer allocations: what a step captured against the buffer depends on."""

    @property
    def capacity(self) -> int:
        """Frames the current buffer holds."""
        return 0 if self._buffer is None else self._buffer.shape[-2]

    def reserve(self, num_frames: int, device: torch.device, dtype: torch.dtype) -> None:
        """Make room for ``num_frames`` frames in total, growing at least 2x when it grows.

        Args:
            num_frames: total frames the buffer must hold.
            device: device of the buffer.
            dtype: dtype of the buffer.

        Raises:
            CacheStateError: the cache holds frames on another device or in another dtype.
        """
        buf = self._buffer
        if buf is not None and (buf.device != device or buf.dtype != dtype):
            if self.num_frames:
                raise CacheStateError(
                    f'camera cache holds {self.num_frames} frames as {buf.dtype} on {buf.device}; '
                    f'got {dtype} on {device}: reset the cache first')
            buf = self._buffer = None
        if num_frames <= self.capacity:
            return
        capacity = max(num_frames, 2 * self.capacity, self._min_capacity)
        # A plain (non-inference) tensor, so it can be written in and out of inference mode.
        # Zeros, not empty: ``attend_at`` attends over every slot with the unused ones masked,
        # and a masked slot holding a NaN bit pattern still poisons the output (0 * NaN).
        with torch.inference_mode(False), torch.no_grad():
            new = torch.zeros(self._dims + (capacity, self._head_dim), device=device,
                              dtype=dtype)
            if buf is not None and self.num_frames:
                new[..., :self.num_frames, :] = buf[..., :self.num_frames, :]
        self._buffer = new
        self.generation += 1

    def attend(self, iteration: int, block: int, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> torch.Tensor:
        """Write k, v after the cached frames, then attend over cached + new (no mask).

        Args:
            iteration: refinement iteration.
            block: trunk block.
            q: [1, heads, N, D] queries of the N new frames.
            k: [1, heads, N, D] their keys.
            v: [1, heads, N, D] their values.

        Returns:
            [1, heads, N, D] attended values.
        """
        start, stop = self.num_frames, self.num_frames + q.shape[-2]
        self.reserve(stop, k.device, k.dtype)
        kv = self._buffer[iteration, block]
        kv[0, :, start:stop] = k[0].detach()
        kv[1, :, start:stop] = v[0].detach()
        return F.scaled_dot_product_attention(q, kv[0, None, :, :stop], kv[1, None, :, :stop])

    def attend_at(self, iteration: int, block: int, q: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """One frame's :meth:`attend` with its slot as a device tensor: fixed shapes throughout.

        The frame's k, v go to slot ``slot`` (= the cached frame count) and it attends over
        the whole buffer with slots after ``slot`` masked out: the same softmax as
        :meth:`attend` (masked keys get weight 0), but no shape depends on the frame count, so
        it can be replayed as a CUDA graph until the buffer grows. The caller reserves room.

        Args:
            iteration: refinement iteration.
            block: trunk block.
            q: [1, heads, 1, D] query of the frame.
            k: [1, heads, 1, D] its key.
            v: [1, heads, 1, D] its value.
            slot: int64 scalar tensor on the buffer's device.

        Returns:
            [1, heads, 1, D] attended values.
        """
        kv = self._buffer[iteration, block]
        index = slot.view(1)
        kv[0].index_copy_(1, index, k[0].detach())
        kv[1].index_copy_(1, index, v[0].detach())
        slots = torch.arange(kv.shape[-2], device=kv.device)
        mask = torch.zeros(slots.shape, dtype=kv.dtype, device=kv.device)
        mask = mask.masked_fill(slots > slot, float('-inf'))
        return F.scaled_dot_product_attention(q, kv[0, None], kv[1, None],
                                              attn_mask=mask.view(1, -1))

    def reset(self, keep_memory: bool = False) -> None:
        """Forget every frame; free the buffer unless ``keep_memory``."""
        self.num_frames = 0
        if not keep_memory:
            self._buffer = None

    def stats(self) -> CameraCacheStats:
        """Frame counts and bytes of the cache."""
        per_frame = 0
        if self._buffer is not None:
            per_frame = self._buffer[..., :1, :].numel() * self._buffer.element_size()
        return CameraCacheStats(num_frames=self.num_frames, capacity_frames=self.capacity,
                                used_bytes=per_frame * self.num_frames,
                                allocated_bytes=per_frame * self.capacity)


class CameraHead(nn.Module):
    """Pose encodings from camera tokens, streaming through a never-evicted K/V cache."""

    def __init__(self, dim: int = 2048, num_heads: int = 16, trunk_depth: int = 4,
                 num_iterations: int = 4, mlp_ratio: float = 4.0) -> None:
        """Build the head (defaults: the official model).

        Args:
            dim: C = 2 * embed_dim, the width of a tap.
            num_heads: trunk attention heads (must divide ``dim``).
            trunk_depth: J, trunk blocks.
            num_iterations: I, refinement iterations (not part of the weights).
            mlp_ratio: trunk MLP width / C.

        Raises:
            ValueError: bad sizes.
        """
        super().__init__()
        if num_iterations < 1 or trunk_depth < 1:
            raise ValueError(f'CameraHead: num_iterations={num_iterations} and '
                             f'trunk_depth={trunk_depth} must be >= 1')
        self.num_iterations = num_iterations
        self.token_norm = nn.LayerNorm(dim, eps=1e-5)
        self.trunk = nn.ModuleList(Block(dim, num_heads, mlp_ratio, qk_norm=False, norm_eps=1e-5)
                                   for _ in range(trunk_depth))
        self.trunk_norm = nn.LayerNorm(dim, eps=1e-5)
        self.empty_pose_tokens = nn.Parameter(torch.zeros(1, 1, POSE_DIM))
        self.embed_pose = nn.Linear(POSE_DIM, dim)
        self.poseLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 3 * dim))
        self.adaln_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.pose_branch = Mlp(dim, dim // 2, POSE_DIM)
        self.cache = CameraKVCache(num_iterations, trunk_depth, num_heads, dim // num_heads)

    @classmethod
    def from_config(cls, config: ModelConfig) -> 'CameraHead':
        """Build the head for a model configuration (official or 'tiny')."""
        return cls(dim=2 * config.embed_dim, num_heads=config.camera_num_heads,
                   trunk_depth=config.camera_trunk_depth,
                   num_iterations=config.camera_num_iterations, mlp_ratio=config.mlp_ratio)

    def reset_cache(self, keep_memory: bool = False) -> None:
        """Start a new session: forget all cached frames (free the memory unless asked)."""
        self.cache.reset(keep_memory)

    @property
    def compute_dtype(self) -> torch.dtype:
        """Dtype of the trunk's products and of the camera K/V cache."""
        return self.trunk[0].attn.qkv.weight.dtype

    def set_compute_dtype(self, dtype: torch.dtype) -> 'CameraHead':
        """Hold the trunk and ``poseLN_modulation`` weights in ``dtype`` (see the module doc).

        The rest of the head keeps its dtype. Call before the first frame of a session (the
        camera cache must be empty or is dropped).

        Raises:
            ValueError: not a floating dtype.
            CacheStateError: the camera cache holds frames.
        """
        if not dtype.is_floating_point:
            raise ValueError(f'CameraHead.set_compute_dtype: {dtype} is not a floating dtype')
        if self.cache.num_frames:
            raise CacheStateError('CameraHead.set_compute_dtype: the camera cache holds '
                                  f'{self.cache.num_frames} frames; reset it first')
        self.trunk.to(dtype)
        self.poseLN_modulation.to(dtype)
        self.cache.reset()
        return self

    def reserve_cache(self, num_frames: int) -> None:
        """Preallocate room for ``num_frames`` cached frames (optional; the cache grows anyway)."""
        self.cache.reserve(num_frames, self.embed_pose.weight.device, self.compute_dtype)

    def cache_stats(self) -> CameraCacheStats:
        """Frames and bytes held by the K/V cache."""
        return self.cache.stats()

    def forward(self, tokens: torch.Tensor,
                mode: Role = 'scale') -> tuple[torch.Tensor, torch.Tensor]:
        """Predict pose encodings and update the cache according to ``mode``.

        Args:
            tokens: the camera slot of the last tap, [S, C]; or the whole tap [S, P, C], of which
                token 0 (the camera token) is used. Any float dtype.
            mode: 'scale' (bidirectional over the S frames, cached; cache must be empty),
                'keyframe' (S = 1, cached) or 'non-keyframe' (S = 1, not cached).

        Returns:
            ``(pose_enc [S, 9], pose_enc_iters [S, I, 9])`` in the parameters' dtype; the last
            iteration is ``pose_enc``. Layout ``[t(3), q_xyzw(4), fov_h, fov_w]`` (see
            ``geometry.py``).

        Raises:
            ValueError: bad shape or mode, or S != 1 for a streaming frame.
            CacheStateError: 'scale' on a non-empty cache.
        """
        camera = self._check_inputs(tokens, mode)
        with torch.autocast(device_type=camera.device.type, enabled=False):
            iters = self._refine(camera, self._attend_fn)
        self.end_frame(mode, camera.shape[0])
        return iters[:, -1], iters

    # ---- the fixed-shape streaming step (replayable; the frame runner captures it) ----------

    def begin_frame(self, tokens: torch.Tensor, mode: Role) -> tuple[torch.Tensor, int]:
        """Check a streaming frame and make room for it: its camera token and cache slot.

        Then :meth:`frame_step` (any number of times, e.g. captured) and :meth:`end_frame`
        give what :meth:`forward` gives.

        Returns:
            ``(camera [1, C], slot)``; the slot is the cached frame count.

        Raises:
            ValueError: as :meth:`forward`, or ``mode='scale'``.
        """
        if mode == 'scale':
            raise ValueError("CameraHead.begin_frame: 'scale' has no fixed-shape step")
        camera = self._check_inputs(tokens, mode)
        self.reserve_cache(self.cache.num_frames + 1)
        return camera, self.cache.num_frames

    def frame_step(self, camera: torch.Tensor, slot: torch.Tensor) -> tuple[torch.Tensor]:
        """One streaming frame's refinement with fixed shapes; returns ``([1, I, 9],)``.

        Masked attention at the slot given as a device tensor (``CameraKVCache.attend_at``):
        no shape depends on the frame count until the buffer grows. Call under
        ``torch.autocast(enabled=False)``, as :meth:`forward` runs.
        """
        def attend_for(it: int, j: int) -> Attend:
            return lambda q, k, v: self.cache.attend_at(it, j, q, k, v, slot)
        return (self._refine(camera, attend_for),)

    def end_frame(self, mode: Role, num_frames: int) -> None:
        """Count the call's frames as cached (a non-keyframe leaves the count as it was)."""
        if mode != 'non-keyframe':
            self.cache.num_frames += num_frames

    def _refine(self, tokens: torch.Tensor,
                attend_for: Callable[[int, int], Attend]) -> torch.Tensor:
        """Run the I refinement iterations of [S, C] camera tokens; return [S, I, 9]."""
        camera = self.token_norm(tokens.to(self.embed_pose.weight.dtype))[None]  # [1, S, C]
        pose_raw: torch.Tensor | None = None
        outputs = []
        for it in range(self.num_iterations):
            if pose_raw is None:
                cond = self.empty_pose_tokens.expand(1, camera.shape[1], POSE_DIM)
            else:
                cond = pose_raw = pose_raw.detach()
            u = self.embed_pose(cond).to(self.compute_dtype)
            shift, scale, gate = self.poseLN_modulation(u).chunk(3, -1)
            x = gate * (self.adaln_norm(camera) * (1 + scale) + shift) + camera
            for j, block in enumerate(self.trunk):
                x = block(x, attend=attend_for(it, j))
            delta = self.pose_branch(self.trunk_norm(x))
            pose_raw = delta if pose_raw is None else pose_raw + delta
            outputs.append(torch.cat([pose_raw[..., :7], F.relu(pose_raw[..., 7:])], -1))
        return torch.stack(outputs, dim=2)[0]

    def _attend_fn(self, iteration: int, block: int) -> Attend:
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return self.cache.attend(iteration, block, q, k, v)
        return attend

    def _check_inputs(self, tokens: torch.Tensor, mode: str) -> torch.Tensor:
        dim = self.embed_pose.out_features
        if tokens.ndim == 3:
            tokens = tokens[:, 0]
        if tokens.ndim != 2 or tokens.shape[1] != dim or tokens.shape[0] < 1:
            raise ValueError(f'CameraHead: expected tokens [S, {dim}] or [S, P, {dim}], got '
                             f'{list(tokens.shape)}')
        if mode not in ('scale', 'keyframe', 'non-keyframe'):
            raise ValueError(f"CameraHead: mode='{mode}' is not 'scale', 'keyframe' or "
                             "'non-keyframe'")
        if mode == 'scale' and self.cache.num_frames:
            raise CacheStateError(f"CameraHead: 'scale' needs an empty cache, it holds "
                                  f'{self.cache.num_frames} frames; call reset_cache() first')
        if mode != 'scale' and tokens.shape[0] != 1:
            raise ValueError(f"CameraHead: mode='{mode}' takes one frame, got S={tokens.shape[0]}")
        return tokens
