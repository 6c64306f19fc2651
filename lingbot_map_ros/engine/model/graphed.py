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
"""Segmented streaming-frame runner: the fixed-shape work of a frame replayed as CUDA graphs.

Dims: P = 6 + h*w tokens of the one streaming frame, C embed dim, H heads of D dims, L = depth.

Why: a streaming frame of the official model launches thousands of small kernels (LayerNorms,
casts, GEMMs, RoPE, residual adds). Issued one by one from Python they cost far more host time
than the GPU needs to run them, so the GPU waits on the host (docs/performance.md, 'CUDA
graphs'). Everything except the cross-frame attention has the same shapes every frame, so it
can be captured once per resolution and replayed; only the paged-cache attention (whose key
count changes every frame) and its page bookkeeping stay eager.

Segments, each one CUDA graph (``g`` = global block, ``f`` = frame block)::

    seg 0      image -> normalise -> DINO -> [specials | patches] -> f0 -> g0 up to (q, k, v)
    seg i      o_{i-1} -> rest of g_{i-1} (proj, LayerScale, MLP) -> f_i -> g_i up to (q, k, v)
    seg L      o_{L-1} -> rest of g_{L-1}
    between    o_i = paged-cache attention of g_i over (q_i, k_i, v_i)   (eager)

Whole frames (``staging``, a backend with ``graph_support == 'whole_frame'``): the pool keeps the
frame's key range and write slots in device tensors (``cache/staged_frames.py``), so the attention
between the segments needs no host decision either, and the whole frame, segments and 24 cache
writes + attentions, is captured as one graph per kind of frame: window filling (flash varlen over
the run), full window keyframe and full window non-keyframe (cuDNN over the fixed patch run + flash
over the special stream). The full-window graphs can be captured ahead of time on placeholder
numbers (``prepare_full_window``, from the session warm-up). The attention inside is the
backend's own capturable form (``AttentionBackend.staged_attention``). Without staging
(FlashInfer, whose plan is host work) the segments are replayed one by one with the cache
attention eager between them. A runner is built for one of the two and stays so: when a
whole-frame capture fails it says so (``fall_back('whole_frame', ...)``), and the frame runner
builds a segment runner in its place.

The segments are compositions of the aggregator's per-layer steps (``aggregator.py``:
``frame_step``, ``global_qkv``, ``global_finish``, ``tap_features``; the cache attention between
them is ``Aggregator.global_attention`` over the frame's plan, or the staged cache), the same steps
:meth:`Aggregator.run` loops over, so results are identical; ``capture=False`` runs them
eagerly (CPU tests of the segmentation). Inputs that change per frame (the image, the 3-D RoPE
table of the frame's time index, the attention output) are copied into static buffers before
replay. Outputs (taps, DINO tokens) are cloned, since the next replay overwrites them.

With ``compile_bodies`` the segment bodies go through ``torch.compile`` (Inductor) before
capture. Why: with the host time gone, a large share of a frame's GPU time is LayerNorms, casts,
RoPE, LayerScale and residual adds, thousands of small memory-bound kernels that Inductor fuses
into a few per block (docs/performance.md, 'torch.compile of the segments'). The bodies are
module-level functions taking the blocks as arguments, so one compiled graph serves all blocks
of a kind (Dynamo treats the parameters as inputs): four compilations per resolution (DINO
block, first tail, middle, last), not 50.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TYPE_CHECKING

import torch

from .aggregator import (Aggregator, AggregatorOutput, frame_step, global_finish, global_qkv,
                         tap_features, with_specials)
from .captured import capture_graph, maybe_compile
from .layers import Block, wide_dtype
from ..errors import CacheStateError
from ..frames import NUM_SPECIAL_TOKENS, Role
from ..profiling import step_range

if TYPE_CHECKING:
    from .dino import DinoTrunk
    from ..attention.staged import StagedKey
    from ..cache.staged_frames import StagedFrames
    from ..cache.stream_kv import StreamKV

Segment = Callable[[], tuple[torch.Tensor, ...]]
FallBack = Callable[[str, BaseException], None]
"""Reports a step-down of the fast path: (its kind, why); ``FastPathState.fall_back``."""


def _token_major(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, H, N, D] -> the same values in ``dtype``, a view of a contiguous [B, N, H, D] tensor.

    The cache stores and attends token-major [N, H, D]: producing that layout here (fused into
    the RoPE kernel when compiled, inside the graph either way) leaves the cache path no
    relayout copies (row b's ``[b].transpose(0, 1)`` is contiguous).
    """
    return t.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format).transpose(1, 2)


def _frame_then_qkv(frame_block: Block, global_block: Block, x: torch.Tensor,
                    frame_cos: torch.Tensor, frame_sin: torch.Tensor, video_cos: torch.Tensor,
                    video_sin: torch.Tensor, kv_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Frame block, then the global block up to its rotated q, k, v (token-major, KV dtype)."""
    x = frame_step(frame_block, x, frame_cos, frame_sin)
    q, k, v = global_qkv(global_block, x, video_cos, video_sin)
    return x, _token_major(q, kv_dtype), _token_major(k, kv_dtype), _token_major(v, kv_dtype)


def _dino_block(block: Block, x: torch.Tensor) -> torch.Tensor:
    return block(x)


def _first_tail(trunk: DinoTrunk, x: torch.Tensor, specials: torch.Tensor, frame_block: Block,
                global_block: Block, *tables: Any) -> tuple[torch.Tensor, ...]:
    """End of DINO, special tokens prepended, then frame block 0 and global block 0's q, k, v."""
    dino = trunk.finish(x)
    x = with_specials(specials, dino)
    return (dino,) + _frame_then_qkv(frame_block, global_block, x, *tables)


def _middle(prev_global: Block, frame_block: Block, global_block: Block, frame_out: torch.Tensor,
            o: torch.Tensor, *tables: Any) -> tuple[torch.Tensor, ...]:
    """Rest of global block i-1, frame block i, global block i up to q, k, v."""
    x = global_finish(prev_global, frame_out, o)
    return (x,) + _frame_then_qkv(frame_block, global_block, x, *tables)


class Bodies:
    """The segment bodies, plain or compiled once each (shared by every segment of a kind).

    The bodies take any number of frames B (batches of several streams: ``batched.py``).
    """

    def __init__(self, compile_bodies: bool) -> None:
        self.dino_block = maybe_compile(_dino_block, compile_bodies)
        self.first_tail = maybe_compile(_first_tail, compile_bodies)
        self.middle = maybe_compile(_middle, compile_bodies)
        self.last = maybe_compile(global_finish, compile_bodies)


def first_segment(agg: Aggregator, bodies: Bodies, images: torch.Tensor, specials: torch.Tensor,
                  *tables: Any) -> tuple[torch.Tensor, ...]:
    """Run segment 0 of ``images`` [B, 3, H, W]: DINO, specials, frame block 0, g0's q, k, v.

    Returns:
        ``(dino, frame_out, q, k, v)``.
    """
    trunk = agg.patch_embed
    x = trunk.embed(agg.normalize(images))
    for block in trunk.blocks:
        x = bodies.dino_block(block, x)
    return bodies.first_tail(trunk, x, specials, agg.frame_blocks[0], agg.global_blocks[0],
                             *tables)


class FrameGraphs:
    """Runs a streaming frame (S = 1) of an aggregator at one resolution, graph by graph."""

    def __init__(self, aggregator: Aggregator, image: torch.Tensor, kv_dtype: torch.dtype,
                 capture: bool, compile_bodies: bool, staging: StagedFrames | None,
                 fall_back: FallBack) -> None:
        """Build the static buffers and (with ``capture``) capture the segments.

        Args:
            aggregator: the model's aggregator.
            image: a [1, 3, H, W] frame of the resolution to capture (used for warm-up).
            kv_dtype: attention dtype of the KV pool.
            capture: capture CUDA graphs (CUDA only); False runs the segments eagerly.
            compile_bodies: ``torch.compile`` the segment bodies (compiled during the first,
                warm-up run of each segment, before capture).
            staging: run whole frames with this staged view of the KV pool; with
                ``capture`` each kind of frame is one CUDA graph, captured on first use. Here
                the segments then only run once (compilation). None: segments.
            fall_back: told ('whole_frame') when a whole frame cannot be captured.
        """
        self._agg = agg = aggregator
        self._kv_dtype = kv_dtype
        device = image.device
        self._h, self._w = image.shape[-2] // agg.config.patch_size, \
            image.shape[-1] // agg.config.patch_size
        self.num_tokens = NUM_SPECIAL_TOKENS + self._h * self._w
        rope_dtype = wide_dtype(agg.camera_token.dtype)
        self._frame_rope = agg.frame_rope.tables(self._h, self._w, device, rope_dtype)
        cos, sin = agg.video_rope.tables(0, 1, self._h, self._w, device, rope_dtype)
        self._image = image.detach().clone()
        self._video_cos, self._video_sin = cos.clone(), sin.clone()
        heads, dim = agg.config.num_heads, agg.config.head_dim
        # Token-major like the attention output, so filling it is a plain copy; the blocks see
        # the [1, H, N, D] view.
        self._o = torch.zeros(self.num_tokens, heads, dim, dtype=kv_dtype,
                              device=device).transpose(0, 1).unsqueeze(0)
        # Parameters do not change between frames: the streaming special tokens are a constant.
        self._specials = agg.special_tokens(1, 'keyframe', torch.float32)
        self._bodies = Bodies(compile_bodies)
        self._capture = capture
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._outputs: list[tuple[torch.Tensor, ...]] = []
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._staging = staging
        self._fall_back = fall_back
        self._whole: dict[StagedKey, tuple[Any, list[tuple[torch.Tensor, ...]]]] = {}
        if staging is not None:
            # One eager pass compiles the bodies here, where the caller can still fall back.
            for i in range(agg.config.depth + 1):
                self._outputs.append(self._segment(i)())
            staging.warm_up(self._o[0].transpose(0, 1))
        else:
            self._build()

    @property
    def image(self) -> torch.Tensor:
        """Return the static input frame ``[1, 3, H, W]`` (its shape, dtype and device)."""
        return self._image

    @property
    def whole_keys(self) -> tuple[StagedKey, ...]:
        """Return the keys of the whole-frame graphs captured so far."""
        return tuple(self._whole)

    # ---- segments --------------------------------------------------------------------------

    def _tables(self) -> tuple[Any, ...]:
        return (*self._frame_rope, self._video_cos, self._video_sin, self._kv_dtype)

    def _run_segment(self, i: int, prev: tuple[torch.Tensor, ...],
                     o: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Segment ``i`` on the previous segment's outputs and global block i-1's attention."""
        agg, bodies = self._agg, self._bodies
        if i == 0:
            return first_segment(agg, bodies, self._image, self._specials, *self._tables())
        frame_out = prev[-4]
        if i == agg.config.depth:
            x = bodies.last(agg.global_blocks[i - 1], frame_out, o)
            rest: tuple[torch.Tensor, ...] = ()
        else:
            x, *rest = bodies.middle(agg.global_blocks[i - 1], agg.frame_blocks[i],
                                     agg.global_blocks[i], frame_out, o, *self._tables())
        tap = (tap_features(frame_out, x),) if i - 1 in agg.config.tap_layers else ()
        return tap + tuple(rest)

    def _segment(self, i: int) -> Segment:
        # Read at call time: the captured static outputs, or the latest eager ones.
        return lambda: self._run_segment(i, self._outputs[i - 1] if i else (), self._o)

    def _build(self) -> None:
        for i in range(self._agg.config.depth + 1):
            segment = self._segment(i)
            self._outputs.append(self._record(segment) if self._capture else segment())
            if not self._capture:
                self._graphs.append(segment)  # type: ignore[arg-type]

    def _record(self, segment: Segment) -> tuple[torch.Tensor, ...]:
        graph, outputs = capture_graph(segment, self._pool)
        self._graphs.append(graph)
        return outputs

    # ---- whole frames (staged cache attention) ------------------------------------------------

    def _whole_frame(self, key: StagedKey) -> list[tuple[torch.Tensor, ...]]:
        """Every segment and every cache write + attention of a staged frame, in order.

        Returns:
            The outputs of each segment.
        """
        staging = self._staged_cache()
        outputs: list[tuple[torch.Tensor, ...]] = []
        o = self._o
        for i in range(self._agg.config.depth + 1):
            if i > 0:
                _, q, k, v = (t[0].transpose(0, 1) for t in outputs[i - 1][-4:])
                staging.write(i - 1, k, v)
                o = staging.attend(i - 1, key, q).transpose(0, 1).unsqueeze(0)
            outputs.append(self._run_segment(i, outputs[i - 1] if i else (), o))
        return outputs

    def _staged_cache(self) -> StagedFrames:
        if self._staging is None:
            raise CacheStateError('whole frames need a runner built with staging')
        return self._staging

    def _whole_graph(self, key: StagedKey) -> tuple[Any, list[tuple[torch.Tensor, ...]]]:
        """Return the captured whole frame of ``key`` and its outputs (captured on first use).

        Capturing runs the frame once first (``capture_graph``'s warm-up), on the staged numbers
        in place: its cache writes are the same the replay makes, so a live frame can be the
        one that triggers the capture.
        """
        if key not in self._whole:
            self._whole[key] = capture_graph(lambda: self._whole_frame(key), self._pool)
        return self._whole[key]

    def prepare_full_window(self, kv: StreamKV) -> None:
        """Capture the full-window graphs of stream ``kv``'s lease now, not mid-stream.

        Writes placeholder keys into that stream's pages: the caller resets it before real
        frames. A capture that fails is reported (see ``_give_up_whole_frames``).
        """
        if self._staging is None or not self._capture:
            return
        try:
            for keyframe in (True, False):
                self._whole_graph(self._staging.stage_placeholder(kv, keyframe))
        except RuntimeError as exc:
            self._give_up_whole_frames(exc)

    def _give_up_whole_frames(self, exc: Exception) -> None:
        """Report that whole frames cannot be captured here (the runner builds segments)."""
        self._whole.clear()
        self._fall_back('whole_frame', exc)

    # ---- one frame --------------------------------------------------------------------------

    def run(self, images: torch.Tensor, time_index: int, mode: Role,
            kv: StreamKV) -> AggregatorOutput:
        """Run one streaming frame: one whole-frame graph (staged), or segment by segment.

        Args:
            images: [1, 3, H, W] in [0, 1] at the captured resolution.
            time_index: the frame's 3-D RoPE time index (already checked by the caller).
            mode: 'keyframe' or 'non-keyframe'.
            kv: the stream's KV cache (its pool is the one staged on).

        Returns:
            The frame's taps and DINO tokens (fresh tensors).
        """
        agg = self._agg
        self._image.copy_(images)
        cos, sin = agg.video_rope.tables(time_index, 1, self._h, self._w, images.device,
                                         self._video_cos.dtype)
        self._video_cos.copy_(cos)
        self._video_sin.copy_(sin)
        if self._staging is not None:
            outputs = self._run_staged(mode == 'keyframe', kv)
        else:
            outputs = self._run_segments(mode, kv)
        taps = [outputs[i][0].clone() for i in range(1, len(outputs))
                if i - 1 in agg.config.tap_layers]
        dino = outputs[0][0].clone()
        return AggregatorOutput(taps=taps, dino_tokens=dino, patch_hw=(self._h, self._w))

    def _run_staged(self, keyframe: bool, kv: StreamKV) -> list[tuple[torch.Tensor, ...]]:
        staging = self._staged_cache()
        with step_range('stage'):
            key = staging.stage_frame(kv, keyframe)
        try:
            outputs = self._staged_outputs(key)
        except BaseException:
            staging.finish(failed=True)
            raise
        with step_range('unstage'):
            staging.finish()
        return outputs

    def _staged_outputs(self, key: StagedKey) -> list[tuple[torch.Tensor, ...]]:
        if not self._capture:
            return self._whole_frame(key)
        try:
            graph, outputs = self._whole_graph(key)
        except RuntimeError as exc:
            # The next frames go segment by segment. This one is already staged: it runs
            # eagerly over the whole run as one range (no split: cuDNN is the likeliest
            # culprit), making the same cache writes the failed warm-up made.
            self._give_up_whole_frames(exc)
            return self._whole_frame(('range',))
        with step_range('graph launch'):
            graph.replay()
        return outputs

    def _run_segments(self, mode: Role, kv: StreamKV) -> list[tuple[torch.Tensor, ...]]:
        agg = self._agg
        plan = kv.plan_frame(mode)
        try:
            for i, step in enumerate(self._graphs):
                if i > 0:
                    _, q, k, v = self._outputs[i - 1][-4:]
                    self._o.copy_(agg.global_attention(i - 1, kv, plan)(q, k, v))
                if self._capture:
                    with step_range('graph launch'):
                        step.replay()
                    outputs = self._outputs[i]
                else:
                    outputs = step()  # type: ignore[operator]
                self._outputs[i] = outputs
        except BaseException:
            kv.end_frame(plan, failed=True)
            raise
        kv.end_frame(plan)
        return self._outputs
