"""Segmented streaming-frame runner: the fixed-shape work of a frame replayed as CUDA graphs.

Dims: P = 6 + h*w tokens of the one streaming frame, C embed dim, H heads of D dims, L = depth.

Why: a streaming frame of the official model launches thousands of small kernels (LayerNorms,
casts, GEMMs, RoPE, residual adds). Issued one by one from Python they cost far more host time
than the GPU needs to run them: on the H200 at 504x378 eager PyTorch took ~100 ms of host time
per frame for ~25 ms of GPU work (bench/results/h200_baseline/profile_sdpa.txt). Everything
except the cross-frame attention has the same shapes every frame, so it can be captured once
per resolution and replayed; only the paged-cache attention (whose key count changes every
frame) and its page bookkeeping stay eager.

Segments, each one CUDA graph (``g`` = global block, ``f`` = frame block)::

    seg 0      image -> normalise -> DINO -> [specials | patches] -> f0 -> g0 up to (q, k, v)
    seg i      o_{i-1} -> rest of g_{i-1} (proj, LayerScale, MLP) -> f_i -> g_i up to (q, k, v)
    seg L      o_{L-1} -> rest of g_{L-1}
    between    o_i = paged-cache attention of g_i over (q_i, k_i, v_i)   (eager)

The segments call the same modules in the same order as :meth:`Aggregator.forward`, so results
are identical; ``capture=False`` runs them eagerly (CPU tests of the segmentation). Inputs that
change per frame (the image, the 3-D RoPE table of the frame's time index, the attention output)
are copied into static buffers before replay. Outputs (taps, DINO tokens) are cloned, since the
next replay overwrites them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .layers import Block, wide_dtype
from .layers.rope import rotate_half_2d, rotate_interleaved

if TYPE_CHECKING:
    from .aggregator import Aggregator, AggregatorOutput, Mode

Segment = Callable[[], tuple[torch.Tensor, ...]]


def _post_attention(block: Block, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Finish a block after its attention: the same ops as ``Block.forward``."""
    x = x + block.ls1(block.attn.project_out(o))
    return x + block.ls2(block.mlp(block.norm2(x)))


class FrameGraphs:
    """Runs a streaming frame (S = 1) of an aggregator at one resolution, graph by graph."""

    def __init__(self, aggregator: Aggregator, image: torch.Tensor, capture: bool) -> None:
        """Build the static buffers and (with ``capture``) capture the segments.

        Args:
            aggregator: the model's aggregator (its cache already configured).
            image: a [1, 3, H, W] frame of the resolution to capture (used for warm-up).
            capture: capture CUDA graphs (CUDA only); False runs the segments eagerly.
        """
        self._agg = agg = aggregator
        device = image.device
        self._h, self._w = image.shape[-2] // agg.config.patch_size, \
            image.shape[-1] // agg.config.patch_size
        self.num_tokens = 6 + self._h * self._w
        rope_dtype = wide_dtype(agg.camera_token.dtype)
        self._frame_rope = agg.frame_rope.tables(self._h, self._w, device, rope_dtype)
        cos, sin = agg.video_rope.tables(0, 1, self._h, self._w, device, rope_dtype)
        self._image = image.detach().clone()
        self._video_cos, self._video_sin = cos.clone(), sin.clone()
        heads, dim = agg.config.num_heads, agg.config.head_dim
        self._o = torch.zeros(1, heads, self.num_tokens, dim, dtype=agg.kv_dtype, device=device)
        # Parameters do not change between frames: the streaming special tokens are a constant.
        self._specials = agg.special_tokens(1, 'keyframe', torch.float32)
        self._capture = capture
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._outputs: list[tuple[torch.Tensor, ...]] = []
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._build()

    # ---- segments --------------------------------------------------------------------------

    def _rope_frame(self, t: torch.Tensor) -> torch.Tensor:
        return rotate_half_2d(t, *self._frame_rope)

    def _rope_video(self, t: torch.Tensor) -> torch.Tensor:
        return rotate_interleaved(t, self._video_cos, self._video_sin)

    def _pre_global(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Frame block i, then global block i up to its rotated q, k, v."""
        x = self._agg.frame_blocks[i](x, rope=self._rope_frame)
        block = self._agg.global_blocks[i]
        q, k, v = block.attn.project_qkv(block.norm1(x))
        return x, self._rope_video(q), self._rope_video(k), v

    def _segment(self, i: int) -> Segment:
        agg, taps = self._agg, self._agg.config.tap_layers

        def first() -> tuple[torch.Tensor, ...]:
            dino = agg.patch_embed(agg._normalize(self._image))
            x = torch.cat([self._specials.to(dino.dtype), dino], dim=1)
            return (dino,) + self._pre_global(0, x)

        def middle() -> tuple[torch.Tensor, ...]:
            # Read at call time: the captured static outputs, or the latest eager ones.
            frame_out = self._outputs[i - 1][-4]
            x = _post_attention(agg.global_blocks[i - 1], frame_out, self._o)
            tap = (torch.cat([frame_out, x], dim=-1),) if i - 1 in taps else ()
            if i == agg.config.depth:
                return tap
            return tap + self._pre_global(i, x)

        return first if i == 0 else middle

    def _build(self) -> None:
        for i in range(self._agg.config.depth + 1):
            segment = self._segment(i)
            self._outputs.append(self._record(segment) if self._capture else segment())
            if not self._capture:
                self._graphs.append(segment)  # type: ignore[arg-type]

    def _record(self, segment: Segment) -> tuple[torch.Tensor, ...]:
        # Warm up on a side stream (library handles, cached tables), then capture.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            segment()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = segment()
        self._graphs.append(graph)
        return outputs

    # ---- one frame --------------------------------------------------------------------------

    def run(self, images: torch.Tensor, time_index: int, mode: Mode) -> AggregatorOutput:
        """Run one streaming frame through all segments and the cache attention.

        Args:
            images: [1, 3, H, W] in [0, 1] at the captured resolution.
            time_index: the frame's 3-D RoPE time index (already checked by the caller).
            mode: 'keyframe' or 'non-keyframe'.

        Returns:
            The frame's taps and DINO tokens (fresh tensors).
        """
        from .aggregator import AggregatorOutput

        agg = self._agg
        self._image.copy_(images)
        cos, sin = agg.video_rope.tables(time_index, 1, self._h, self._w, images.device,
                                         self._video_cos.dtype)
        self._video_cos.copy_(cos)
        self._video_sin.copy_(sin)
        taps: list[torch.Tensor] = []
        for i, step in enumerate(self._graphs):
            if i > 0:
                _, q, k, v = self._outputs[i - 1][-4:]
                attend = agg.global_attention(i - 1, mode, 1, self.num_tokens)
                self._o.copy_(attend(q, k, v))
            outputs = step.replay() if self._capture else step()  # type: ignore[operator]
            outputs = self._outputs[i] if self._capture else outputs
            self._outputs[i] = outputs
            if i > 0 and i - 1 in agg.config.tap_layers:
                taps.append(outputs[0].clone())
        dino = self._outputs[0][0].clone()
        return AggregatorOutput(taps=taps, dino_tokens=dino, patch_hw=(self._h, self._w))
