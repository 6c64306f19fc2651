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
"""8-bit attention designs emulated in float32: where their error comes from (issue #44).

Each design is a :class:`Recipe`: what is rounded, at which granularity, and how the P.V sums
are kept. :func:`emulated_attention` quantises and dequantises the operands as the design's
kernel would (the values a kernel would multiply, exactly, in float32) and runs the online
softmax over key blocks, so its error is the design's rounding and nothing else. It is slow
(every score is materialised) and exists to choose a design before a kernel is written; the
package never uses it. :class:`EmulatedBackend` puts it behind the cache's attention backend
protocol for the long-sequence gate (``bench/emulated_fidelity.py``).

The designs (issue #44's rows, after SageAttention2's published recipe):

* Q.K in INT8: queries per 16 rows and keys per 128 keys, one symmetric scale each (per head),
  the keys first shifted by a key mean fixed per stream (from the scale frames' keys): every
  score of a query moves by the same ``q . mean``, which softmax ignores;
* optionally a 64 x 64 Hadamard with random signs on Q and K (orthonormal: Q.K unchanged);
* P = exp(S - running max) in [0, 1], rounded to e4m3 after scaling by 448 (or to bf16);
* V in e4m3 with one scale per channel (per head) over the visible keys;
* the P.V sums: 'two_level' (each 128-key block's product in float32, added in float32) or
  'one_level' (one accumulator whose sum is cut to ``acc_bits`` fraction bits after each
  block, as FP8 tensor cores keep it without promotion); the row sums of P in float32.

Shapes: ``q: [Q, H, D]``, ``k, v: [K, H, D]``; the output is ``[Q, H, D]`` float32.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Any

import torch

E4M3_MAX = 448.0
INT8_MAX = 127.0


@dataclass(frozen=True)
class Recipe:
    """One emulated attention design (see the module docstring)."""

    qk: str = 'int8'
    """'int8' (Q per ``query_block`` rows, K per ``key_block`` keys) or 'exact' (float32)."""
    key_mean: bool = True
    """Subtract the stream's fixed key mean from the keys before they are quantised."""
    hadamard: bool = False
    """Rotate Q and K by the same random-sign Hadamard before they are quantised."""
    p_format: str = 'e4m3'
    """How P is rounded for P.V: 'e4m3' (scaled to 448), 'bf16' or 'exact'."""
    v_format: str = 'e4m3'
    """How V is rounded: 'e4m3' (one scale per channel) or 'exact'."""
    accumulation: str = 'two_level'
    """'two_level' (float32 per block, added in float32) or 'one_level' (cut sums)."""
    acc_bits: int = 13
    """Fraction bits the one-level accumulator keeps (float32 keeps 23)."""
    query_block: int = 16
    """Query rows per INT8 scale."""
    key_block: int = 128
    """Keys per INT8 scale and per online-softmax block (one P.V product)."""


RECIPES: dict[str, Recipe] = {
    'a': Recipe(),
    'b': Recipe(hadamard=True),
    'c': Recipe(accumulation='one_level'),
    'd': Recipe(p_format='bf16'),
}
"""Issue #44's emulated rows: (a) the SageAttention2-style recipe, (b) with the Hadamard,
(c) with one-level accumulation, (d) with P in bf16."""


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round float32 ``x`` to e4m3 (saturating at +-448) and back to float32."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def cut_fraction(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Keep ``bits`` fraction bits of float32 ``x``, dropping the rest (toward zero)."""
    if not 0 <= bits <= 23:
        raise ValueError(f'fraction bits must be in [0, 23], got {bits}')
    if bits == 23:
        return x
    mask = -(1 << (23 - bits))  # ones over sign, exponent and the kept fraction bits
    return (x.contiguous().view(torch.int32) & mask).view(torch.float32)


def quantize_int8(x: torch.Tensor, group: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round ``x`` to INT8 levels with one symmetric scale per ``group`` entries along ``dim``.

    ``x`` is ``[..., N, D]`` with ``dim`` pointing at ``N`` (-2); each group of ``group``
    consecutive rows (the last group may be shorter) shares the scale ``amax / 127``.

    Returns:
        ``(levels, scales)``: integer-valued float32 levels in [-127, 127], the shape of
        ``x``, and the scale of every row (``[..., N, 1]``), so ``levels * scales`` is the
        dequantised ``x``.
    """
    if dim != -2:
        raise ValueError('quantize_int8 groups rows: dim must be -2')
    rows = x.shape[-2]
    pad = (-rows) % group
    padded = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
    blocks = padded.reshape(*x.shape[:-2], (rows + pad) // group, group * x.shape[-1])
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    levels = torch.round(blocks / scale).clamp(-INT8_MAX, INT8_MAX)
    levels = levels.reshape(padded.shape)[..., :rows, :]
    scales = scale.expand(*scale.shape[:-1], group).reshape(*x.shape[:-2], rows + pad, 1)
    return levels, scales[..., :rows, :]


def hadamard(dim: int, seed: int = 0, device: torch.device | str = 'cpu') -> torch.Tensor:
    """Return an orthonormal ``dim x dim`` Hadamard matrix with random row signs (float32).

    Raises:
        ValueError: ``dim`` is not a power of two.
    """
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f'a Hadamard matrix needs a power-of-two size, got {dim}')
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (dim,), generator=gen).to(torch.float64) * 2 - 1
    return (signs[:, None] * h / math.sqrt(dim)).to(torch.float32).to(device)


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    """``[N, H, D]`` -> ``[H, N, D]`` float32 (a copy)."""
    return t.transpose(0, 1).to(torch.float32).contiguous()


def emulated_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, recipe: Recipe,
                       key_mean: torch.Tensor | None = None, heads_per_pass: int = 4,
                       ) -> torch.Tensor:
    """Attend ``q: [Q, H, D]`` to ``k, v: [K, H, D]`` as ``recipe``'s kernel would round it.

    Args:
        q: Queries (post-RoPE, post-norm); the scale ``1/sqrt(D)`` is applied here.
        k: Keys.
        v: Values.
        recipe: The design.
        key_mean: ``[H, D]``, the stream's fixed key mean (``recipe.key_mean``); None: the
            mean of ``k``.
        heads_per_pass: Heads whose scores are held at once (memory).

    Returns:
        ``[Q, H, D]`` float32.

    Raises:
        ValueError: shapes that do not fit, or an unknown format.
    """
    if q.dim() != 3 or k.shape != v.shape or k.dim() != 3 or q.shape[1:] != k.shape[1:]:
        raise ValueError(f'q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: '
                         'expected [Q, H, D] and two [K, H, D]')
    for name, value, allowed in (('qk', recipe.qk, ('int8', 'exact')),
                                 ('p_format', recipe.p_format, ('e4m3', 'bf16', 'exact')),
                                 ('v_format', recipe.v_format, ('e4m3', 'exact')),
                                 ('accumulation', recipe.accumulation,
                                  ('two_level', 'one_level'))):
        if value not in allowed:
            raise ValueError(f'recipe.{name} must be one of {allowed}, got {value!r}')
    heads, dim = q.shape[1], q.shape[2]
    qh = _heads_first(q) * (1.0 / math.sqrt(dim))
    kh, vh = _heads_first(k), _heads_first(v)
    if recipe.key_mean:
        mean = kh.mean(1) if key_mean is None else key_mean.to(kh)
        kh = kh - mean[:, None, :]
    if recipe.hadamard:
        rot = hadamard(dim, device=q.device)
        qh, kh = qh @ rot, kh @ rot
    if recipe.v_format == 'e4m3':
        amax = vh.abs().amax(1, keepdim=True)
        vscale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        vh = to_e4m3(vh / vscale) * vscale
    if recipe.qk == 'int8':
        ql, qs = quantize_int8(qh, recipe.query_block, -2)
        kl, ks = quantize_int8(kh, recipe.key_block, -2)
    else:
        ql, qs, kl, ks = qh, torch.ones_like(qh[..., :1]), kh, torch.ones_like(kh[..., :1])
    out = torch.empty_like(qh)
    for h0 in range(0, heads, heads_per_pass):
        sl = slice(h0, h0 + heads_per_pass)
        out[sl] = _online_softmax(ql[sl], qs[sl], kl[sl], ks[sl], vh[sl], recipe)
    return out.transpose(0, 1)


def _online_softmax(ql: torch.Tensor, qs: torch.Tensor, kl: torch.Tensor, ks: torch.Tensor,
                    v: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Run the block-wise softmax and P.V of a few heads: ``[h, Q, D]`` float32."""
    nk, block = kl.shape[1], recipe.key_block
    nb = -(-nk // block)
    pad = nb * block - nk
    # Integer levels: every product and sum is exact in float32 (64 * 127^2 < 2^24).
    s = (ql @ kl.transpose(1, 2)) * qs * ks.transpose(1, 2)
    if pad:
        s = torch.nn.functional.pad(s, (0, pad), value=-math.inf)
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
    s = s.view(s.shape[0], s.shape[1], nb, block)
    running = torch.cummax(s.amax(-1), dim=-1).values  # [h, Q, nb]: the max after each block
    p = torch.exp(s - running[..., None])
    del s
    row_sums = p.sum(-1)  # [h, Q, nb], float32 P
    if recipe.p_format == 'e4m3':
        p = to_e4m3(p * E4M3_MAX) * (1.0 / E4M3_MAX)
    elif recipe.p_format == 'bf16':
        p = p.to(torch.bfloat16).to(torch.float32)
    vb = v.view(v.shape[0], nb, block, v.shape[-1])
    # Each block's P.V in float32: [h, Q, nb, D].
    blocks = torch.einsum('hqbk,hbkd->hqbd', p, vb)
    del p
    last = running[..., -1:]
    weights = torch.exp(running - last)  # [h, Q, nb]: each block's rescale to the final max
    total = (row_sums * weights).sum(-1, keepdim=True)
    if recipe.accumulation == 'two_level':
        acc = (blocks * weights[..., None]).sum(2)
    else:
        acc = torch.zeros_like(blocks[:, :, 0])
        for b in range(nb):
            alpha = torch.exp(running[..., b - 1] - running[..., b]) if b else None
            acc = acc * alpha[..., None] if alpha is not None else acc
            acc = cut_fraction(acc + blocks[:, :, b], recipe.acc_bits)
    return acc / total


class EmulatedBackend:
    """The cache's attention backend protocol over :func:`emulated_attention` (gate runs only).

    It gathers the visible pages (``PageGather``) and fixes each layer's key mean from the
    scale frames' keys (the leading ``num_scale_pages`` pages of every layout, unchanged for
    the stream's life); before the scale pages exist, the mean of the visible keys.
    """

    name = 'emulated'
    graph_support = 'segments'
    fallbacks = 0

    def __init__(self, recipe: Recipe, heads_per_pass: int = 16) -> None:
        from lingbot_map_ros.engine.attention.page_gather import PageGather
        self.recipe = recipe
        self.heads_per_pass = heads_per_pass
        self._gather = PageGather()

    def staged_attention(self, *args: Any) -> None:
        """Return None: no capturable form."""
        return None

    def plan(self, layout: Any, num_queries: int) -> None:
        """Nothing to plan."""

    def run(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
            layout: Any) -> torch.Tensor:
        """Attend ``q: [Q, H, D]`` to the layout's visible tokens; ``[Q, H, D]`` in q's dtype."""
        k = self._gather(k_pages, layout)
        v = self._gather(v_pages, layout)
        scale_tokens = min(layout.num_scale_pages * layout.page_size, k.shape[0])
        ref = k[:scale_tokens] if scale_tokens else k
        mean = ref.to(torch.float32).mean(0)  # [H, D]
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 products, not tf32
        try:
            out = emulated_attention(q, k, v, self.recipe, key_mean=mean,
                                     heads_per_pass=self.heads_per_pass)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        return out.to(q.dtype)
