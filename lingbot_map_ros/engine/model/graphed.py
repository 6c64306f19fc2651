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

With ``compile_bodies`` the segment bodies go through ``torch.compile`` (Inductor) before
capture. Why: with the host time gone, ~25 % of a frame's GPU time was LayerNorms, casts, RoPE,
LayerScale and residual adds, ~3,000 small memory-bound kernels
(bench/results/h200_cuda_graphs/profile_sdpa.txt) that Inductor fuses into a few per block.
The bodies are module-level functions taking the blocks as arguments, so one compiled graph
serves all blocks of a kind (Dynamo treats the parameters as inputs): four compilations per
resolution (DINO block, first tail, middle, last), not 50.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TYPE_CHECKING

import torch

from .captured import capture_graph, maybe_compile
from .layers import Block, wide_dtype
from .layers.rope import rotate_half_2d, rotate_interleaved

if TYPE_CHECKING:
    from .aggregator import Aggregator, AggregatorOutput, Mode
    from .dino import DinoTrunk

Segment = Callable[[], tuple[torch.Tensor, ...]]


def _token_major(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[1, H, N, D] -> the same values in ``dtype``, a view of a contiguous [N, H, D] tensor.

    The cache stores and attends token-major [N, H, D]: producing that layout here (fused into
    the RoPE kernel when compiled, inside the graph either way) leaves the eager cache path no
    relayout copies.
    """
    tokens = t[0].transpose(0, 1).to(dtype, memory_format=torch.contiguous_format)
    return tokens.transpose(0, 1).unsqueeze(0)


def _post_attention(block: Block, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Finish a block after its attention: the same ops as ``Block.forward``."""
    x = x + block.ls1(block.attn.project_out(o))
    return x + block.ls2(block.mlp(block.norm2(x)))


def _frame_then_qkv(frame_block: Block, global_block: Block, x: torch.Tensor,
                    frame_cos: torch.Tensor, frame_sin: torch.Tensor, video_cos: torch.Tensor,
                    video_sin: torch.Tensor, kv_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Frame block, then the global block up to its rotated q, k, v (token-major, KV dtype)."""
    x = frame_block(x, rope=lambda t: rotate_half_2d(t, frame_cos, frame_sin))
    q, k, v = global_block.attn.project_qkv(global_block.norm1(x))
    q = rotate_interleaved(q, video_cos, video_sin)
    k = rotate_interleaved(k, video_cos, video_sin)
    return x, _token_major(q, kv_dtype), _token_major(k, kv_dtype), _token_major(v, kv_dtype)


def _dino_block(block: Block, x: torch.Tensor) -> torch.Tensor:
    return block(x)


def _first_tail(trunk: DinoTrunk, x: torch.Tensor, specials: torch.Tensor, frame_block: Block,
                global_block: Block, *tables: Any) -> tuple[torch.Tensor, ...]:
    """End of DINO, special tokens prepended, then frame block 0 and global block 0's q, k, v."""
    dino = trunk.finish(x)
    x = torch.cat([specials.to(dino.dtype), dino], dim=1)
    return (dino,) + _frame_then_qkv(frame_block, global_block, x, *tables)


def _middle(prev_global: Block, frame_block: Block, global_block: Block, frame_out: torch.Tensor,
            o: torch.Tensor, *tables: Any) -> tuple[torch.Tensor, ...]:
    """Rest of global block i-1, frame block i, global block i up to q, k, v."""
    x = _post_attention(prev_global, frame_out, o)
    return (x,) + _frame_then_qkv(frame_block, global_block, x, *tables)


class _Bodies:
    """The segment bodies, plain or compiled once each (shared by every segment of a kind)."""

    def __init__(self, compile_bodies: bool) -> None:
        self.dino_block = maybe_compile(_dino_block, compile_bodies)
        self.first_tail = maybe_compile(_first_tail, compile_bodies)
        self.middle = maybe_compile(_middle, compile_bodies)
        self.last = maybe_compile(_post_attention, compile_bodies)


class FrameGraphs:
    """Runs a streaming frame (S = 1) of an aggregator at one resolution, graph by graph."""

    def __init__(self, aggregator: Aggregator, image: torch.Tensor, capture: bool,
                 compile_bodies: bool = False) -> None:
        """Build the static buffers and (with ``capture``) capture the segments.

        Args:
            aggregator: the model's aggregator (its cache already configured).
            image: a [1, 3, H, W] frame of the resolution to capture (used for warm-up).
            capture: capture CUDA graphs (CUDA only); False runs the segments eagerly.
            compile_bodies: ``torch.compile`` the segment bodies (compiled during the first,
                warm-up run of each segment, before capture).
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
        # Token-major like the attention output, so filling it is a plain copy; the blocks see
        # the [1, H, N, D] view.
        self._o = torch.zeros(self.num_tokens, heads, dim, dtype=agg.kv_dtype,
                              device=device).transpose(0, 1).unsqueeze(0)
        # Parameters do not change between frames: the streaming special tokens are a constant.
        self._specials = agg.special_tokens(1, 'keyframe', torch.float32)
        self._bodies = _Bodies(compile_bodies)
        self._capture = capture
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._outputs: list[tuple[torch.Tensor, ...]] = []
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._build()

    # ---- segments --------------------------------------------------------------------------

    def _tables(self) -> tuple[Any, ...]:
        return (*self._frame_rope, self._video_cos, self._video_sin, self._agg.kv_dtype)

    def _segment(self, i: int) -> Segment:
        agg, bodies = self._agg, self._bodies
        taps, depth = agg.config.tap_layers, agg.config.depth

        def first() -> tuple[torch.Tensor, ...]:
            trunk = agg.patch_embed
            x = trunk.embed(agg._normalize(self._image))
            for block in trunk.blocks:
                x = bodies.dino_block(block, x)
            return bodies.first_tail(trunk, x, self._specials, agg.frame_blocks[0],
                                     agg.global_blocks[0], *self._tables())

        def middle() -> tuple[torch.Tensor, ...]:
            # Read at call time: the captured static outputs, or the latest eager ones.
            frame_out = self._outputs[i - 1][-4]
            if i == depth:
                x = bodies.last(agg.global_blocks[i - 1], frame_out, self._o)
                rest: tuple[torch.Tensor, ...] = ()
            else:
                x, *rest = bodies.middle(agg.global_blocks[i - 1], agg.frame_blocks[i],
                                         agg.global_blocks[i], frame_out, self._o,
                                         *self._tables())
            tap = (torch.cat([frame_out, x], dim=-1),) if i - 1 in taps else ()
            return tap + tuple(rest)

        return first if i == 0 else middle

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
