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
"""Attention conformance: every backend x K/V dtype x form, through the cache, vs 'reference'.

One list, :data:`CASES`, names each case: backend, attention dtype, FP8 storage or not, form
('eager': ``StreamKV.plan_frame / write / attend / end_frame``; 'staged': ``StagedFrames``, the
capturable form a whole-frame graph calls), ``cache.precision`` and ``cache.kernel`` fields, where
it runs and its tolerance with the reason. A new backend or kernel form is one more entry.

Every case drives a stream of the tiny engine's shape (``tiny_config``: 2 heads x 64, 6 specials
+ 32 patches a frame; N_s = 2, W = 3; 2 layers), on CUDA also of the official model's (16 heads,
972 patches), through the engine's own protocol: the scale pass (the pinned scale frames), then
keyframes and non-keyframes through the window fill, a full window whose keyframes take the
oldest window page, and (tiny shape) a special stream over two pages.
After each layer's write its output is compared with the ``reference`` backend run on the same
pages and layout (FP8 pages included, so a tolerance measures the kernel, not the storage); the
``reference`` cases are compared with float64 attention over the tokens the test itself knows
are visible. The error is the relative L2 norm over a frame's ``[Q, H, D]`` output.

Where: 'cpu' always runs; 'interpret' runs Triton kernels on the CPU under ``TRITON_INTERPRET=1``
(set it before starting pytest, as for test_triton_attention.py; the interpreter has no bf16
product, so fp16) where the ``triton`` package is installed (CI's CPU torch has none: skipped
there, with the reason). The ``fa3`` parts cases there run FA3's forward as a float64 stand-in
(:func:`fa3_forward_reference`), so what they check is ours: the parts' queries and key starts
(``prepare_parts``) and their merge (``merge_parts``). 'cuda' cases are marked ``gpu``; ``fa3``
also needs a Hopper GPU and ``fa3-fwd``, ``flashinfer`` its package (skipped with the reason).
Staged forms run on the CPU the one host path every form shares (the sdpa staged cases check
it); their kernels run on CUDA only.

CPU: ``python -m pytest test/engine/test_attention_conformance.py``; with the interpreter:
``TRITON_INTERPRET=1 python -m pytest ...``; GPU: ``python -m pytest -m gpu ...``.
"""

from __future__ import annotations

from dataclasses import dataclass
import importlib.util
import math
import os
from typing import Any

from lingbot_map_ros.engine.attention.page_layout import PageLayout
from lingbot_map_ros.engine.attention.sdpa import ReferenceBackend
from lingbot_map_ros.engine.cache import KVPool, StreamKV
from lingbot_map_ros.engine.cache.staged_frames import StagedFrames
from lingbot_map_ros.engine.cache.stream_cache import tokens_per_frame
from lingbot_map_ros.engine.cache.stream_kv import stream_pages
from lingbot_map_ros.engine.frames import NUM_SPECIAL_TOKENS
from lingbot_map_ros.kernel_config import KernelConfig
import pytest
import torch

FP8 = torch.float8_e4m3fn
ON_GPU = torch.cuda.is_available()
INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'
LAYERS = 2
STREAM = {'cache.scale_frames': 2, 'cache.sliding_window': 3, 'cache.max_total_frames': 16,
          'stream.session_keyframes': 16}
SIZES = {'tiny': ({}, (56, 112)), 'official': ({'model.preset': 'official'}, (378, 504))}
"""Model and network input of a run: the tiny engine's (2 heads x 64, 4 x 8 patches: the
specials cross pages within the schedule) and, on CUDA, the official one's (16 heads x 64,
972 patches: the kernels' tiles meet a page that is no multiple of them)."""
SCHEDULE = (True, False, True, True, True, False, True)
"""Streaming frames after the scale pass (True: keyframe): a non-keyframe while the window
fills; W = 3 full at the third keyframe; each keyframe after it takes the page of the oldest
window frame; a non-keyframe on the spare page beside the full window."""
TILE = ('triton_block_m', 64)
"""Interpreter cases: one 64-row query tile holds a frame's 38 queries (the default 128 rows
cost the interpreter twice the time for masked rows)."""


@dataclass(frozen=True)
class Case:
    """One backend x K/V dtype x form, and how close to ``reference`` it must come."""

    backend: str
    """'reference', 'sdpa', 'triton', 'fa3' or 'flashinfer'."""
    dtype: str
    """Attention dtype (the K/V storage dtype too unless ``fp8``)."""
    fp8: bool
    """K/V stored in e4m3 (``cache.dtype: float8_e4m3fn``)."""
    form: str
    """'eager' (``StreamKV.attend``) or 'staged' (``StagedFrames.attend``)."""
    where: str
    """'cpu', 'interpret' (Triton on the CPU, ``TRITON_INTERPRET=1``) or 'cuda'."""
    tol: float
    """Largest relative L2 error of a frame's output against ``reference``."""
    why: str
    """Why that tolerance."""
    precision: str = 'faithful'
    """``cache.precision``."""
    kernel: tuple[tuple[str, Any], ...] = ()
    """``cache.kernel`` fields off their defaults."""

    @property
    def id(self) -> str:  # noqa: A003 - pytest's word for it
        """Return the pytest id: backend-dtype[+fp8]-form[-precision][-kernel]-where."""
        parts = [self.backend, self.dtype + ('+fp8' if self.fp8 else ''), self.form]
        if self.precision != 'faithful':
            parts.append(self.precision)
        parts += [f'{name}={value}' for name, value in self.kernel]
        return '-'.join([*parts, self.where])


FP32_WHY = 'fp32 on both sides; only the summation order differs'
BF16_WHY = 'bf16 P@V and output rounding (2^-9 relative) against fp32'
CASES = [
    # ---- CPU --------------------------------------------------------------------------------
    Case('reference', 'float64', False, 'eager', 'cpu', 1e-12,
         'float64 against float64 dense attention over the tracked tokens'),
    Case('reference', 'float32', False, 'eager', 'cpu', 1e-5, FP32_WHY),
    Case('reference', 'float32', True, 'eager', 'cpu', 1e-5,
         'e4m3 widens exactly to fp32; the dense check reads the same rounded values'),
    Case('sdpa', 'float64', False, 'eager', 'cpu', 1e-12, 'float64 throughout'),
    Case('sdpa', 'float32', False, 'eager', 'cpu', 1e-5, FP32_WHY),
    Case('sdpa', 'float32', True, 'eager', 'cpu', 1e-5, 'FP8 widened exactly: ' + FP32_WHY),
    Case('sdpa', 'float64', False, 'staged', 'cpu', 1e-12, 'float64 throughout'),
    Case('sdpa', 'float32', True, 'staged', 'cpu', 1e-5, 'FP8 widened exactly: ' + FP32_WHY),
    # ---- Triton kernels on the CPU interpreter (fp16: it has no bf16 product) ----------------
    Case('triton', 'float16', False, 'eager', 'interpret', 2e-3,
         'fp16 P@V and output rounding (2^-11 relative) against fp32', kernel=(TILE,)),
    Case('triton', 'float16', False, 'eager', 'interpret', 2e-3,
         'one key part (the kernel normalises itself, no merge): fp16 rounding',
         kernel=(TILE, ('triton_splits', 1))),
    Case('triton', 'float16', True, 'eager', 'interpret', 1e-2,
         'queries in two e4m3 terms (about bf16 precision); the interpreter rounds to e4m3 '
         'more coarsely than the GPU', kernel=(TILE,)),
    Case('triton', 'float16', True, 'eager', 'interpret', 1.5e-1,
         "queries in one e4m3 term (3 mantissa bits); the interpreter's coarser e4m3",
         precision='fast_approximate', kernel=(TILE,)),
    Case('triton', 'float16', True, 'eager', 'interpret', 2e-3,
         'keys widened (exact products): fp16 rounding only',
         kernel=(TILE, ('triton_qk', 'widened'))),
    Case('fa3', 'float16', False, 'eager', 'interpret', 2e-3,
         '4 parts by a float64 stand-in for FA3, merged in fp16: fp16 rounding'),
    Case('fa3', 'float16', True, 'eager', 'interpret', 1.5e-1,
         'parts cast the queries to e4m3 without a scale (3 mantissa bits, small values '
         "subnormal); the interpreter's coarser e4m3",
         precision='fast_approximate'),
    # ---- CUDA -------------------------------------------------------------------------------
    Case('reference', 'float32', False, 'eager', 'cuda', 1e-5, FP32_WHY),
    Case('sdpa', 'float32', False, 'eager', 'cuda', 1e-4, 'fp32 SDPA kernels (no TF32 in it)'),
    Case('sdpa', 'bfloat16', False, 'eager', 'cuda', 1e-2, BF16_WHY + '; cuDNN + flash split'),
    Case('sdpa', 'bfloat16', True, 'eager', 'cuda', 1e-2, 'FP8 widened exactly: ' + BF16_WHY),
    Case('sdpa', 'bfloat16', False, 'staged', 'cuda', 1e-2, BF16_WHY + '; flash range / split'),
    Case('sdpa', 'bfloat16', True, 'staged', 'cuda', 1e-2, 'FP8 widened exactly: ' + BF16_WHY),
    Case('flashinfer', 'bfloat16', False, 'eager', 'cuda', 1e-2, BF16_WHY),
    Case('flashinfer', 'float16', False, 'eager', 'cuda', 1e-2, 'fp16 rounding, below bf16'),
    Case('triton', 'bfloat16', False, 'eager', 'cuda', 1e-2, BF16_WHY),
    Case('triton', 'float16', False, 'eager', 'cuda', 1e-2, 'fp16 rounding, below bf16'),
    Case('triton', 'bfloat16', False, 'eager', 'cuda', 1e-2, BF16_WHY + '; no merge',
         kernel=(('triton_splits', 1),)),
    Case('triton', 'bfloat16', False, 'staged', 'cuda', 1e-2, BF16_WHY),
    Case('triton', 'bfloat16', True, 'eager', 'cuda', 2e-2,
         'FP8 QK with the queries in two e4m3 terms: about bf16 query precision'),
    Case('triton', 'bfloat16', True, 'staged', 'cuda', 2e-2,
         'FP8 QK with the queries in two e4m3 terms: about bf16 query precision'),
    Case('triton', 'bfloat16', True, 'eager', 'cuda', 8e-2,
         'FP8 QK with the queries rounded once to e4m3 (3 mantissa bits)',
         precision='fast_approximate'),
    Case('triton', 'bfloat16', True, 'eager', 'cuda', 1e-2,
         'keys widened in registers (exact products): ' + BF16_WHY,
         kernel=(('triton_qk', 'widened'),)),
    Case('fa3', 'bfloat16', False, 'eager', 'cuda', 1e-2, BF16_WHY + '; 4 parts merged'),
    Case('fa3', 'bfloat16', False, 'staged', 'cuda', 1e-2, BF16_WHY + '; 4 parts merged'),
    Case('fa3', 'bfloat16', False, 'eager', 'cuda', 1e-2, BF16_WHY + "; FA3's own splits",
         kernel=(('fa3_parts', 1),)),
    Case('fa3', 'bfloat16', True, 'eager', 'cuda', 8e-2,
         "FA3's FP8 kernel: e4m3 queries and probabilities", precision='fast_approximate'),
    Case('fa3', 'bfloat16', True, 'staged', 'cuda', 8e-2,
         "FA3's FP8 kernel: e4m3 queries and probabilities", precision='fast_approximate'),
    Case('fa3', 'bfloat16', True, 'eager', 'cuda', 8e-2,
         "FA3's FP8 kernel, one part, unit-scale e4m3 queries", precision='fast_approximate',
         kernel=(('fa3_parts', 1),)),
    Case('fa3', 'bfloat16', True, 'eager', 'cuda', 8e-2,
         "FA3's FP8 kernel, one part, queries scaled per head", precision='fast_approximate',
         kernel=(('fa3_parts', 1), ('fa3_query_scale', 'head'))),
]


def _params() -> list[Any]:
    params = []
    for case in CASES:
        marks = []
        if case.where == 'cuda':
            marks = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason='needs CUDA')]
        for size in ('tiny', 'official') if case.where == 'cuda' else ('tiny',):
            params.append(pytest.param(case, size, marks=marks, id=f'{case.id}-{size}'))
    return params


def _skip_unless_runnable(case: Case) -> None:
    """Skip, with the reason, a case whose kernel or optional wheel cannot run here."""
    if case.backend in ('triton', 'fa3') and importlib.util.find_spec('triton') is None:
        pytest.skip('needs the triton package (CUDA torch ships it; CPU CI has none)')
    if case.where == 'interpret' and (ON_GPU or not INTERPRET):
        pytest.skip('Triton on the CPU: run with TRITON_INTERPRET=1 on a machine without CUDA')
    if case.where != 'cuda':
        return
    if case.backend == 'flashinfer' and importlib.util.find_spec('flashinfer') is None:
        pytest.skip('needs flashinfer (pip install flashinfer-python)')
    if case.backend == 'fa3':
        if torch.cuda.get_device_capability()[0] != 9:
            pytest.skip('fa3 needs a Hopper GPU (compute capability 9.x)')
        if importlib.util.find_spec('fa3_fwd_interface') is None:
            pytest.skip('needs fa3-fwd (FlashAttention-3 forward: pip install fa3-fwd)')


def fa3_forward_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                          cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                          seqused_k: torch.Tensor | None = None, softmax_scale: float,
                          **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """FA3's varlen ``_flash_attn_forward`` contract in float64 (unit FP8 descales).

    Sequence i: queries ``q[cu_q[i]:cu_q[i+1]]`` over keys from ``cu_k[i]``, ``seqused_k[i]``
    of them (else up to ``cu_k[i+1]``). Returns ``(out [Q, H, D], lse [H, Q])``: out in the
    queries' dtype (fp16 for e4m3 queries), lse the natural-log sum-exp in float32.
    """
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float64)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    for i in range(len(cu_q) - 1):
        lo = cu_k[i]
        hi = lo + used[i] if used is not None else cu_k[i + 1]
        if hi > lo:
            rows = slice(cu_q[i], cu_q[i + 1])
            scores = torch.einsum('qhd,khd->hqk', q[rows].double(), k[lo:hi].double())
            scores = scores * softmax_scale
            lse[:, rows] = torch.logsumexp(scores, dim=-1)
            out[rows] = torch.einsum('hqk,khd->qhd', scores.softmax(-1), v[lo:hi].double())
    return out.to(torch.float16 if q.dtype == FP8 else q.dtype), lse.float()


def _fa3_varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, **_: Any) -> torch.Tensor:
    return fa3_forward_reference(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                 softmax_scale=q.shape[-1] ** -0.5)[0]


def _interpreted_backend(case: Case, kernel: KernelConfig) -> Any:
    """Build a case's backend on the CPU (the name is refused off CUDA)."""
    from lingbot_map_ros.engine.attention.triton_backend import TritonBackend
    cpu = torch.device('cpu')
    if case.backend == 'triton':
        return TritonBackend(cpu, precision=case.precision, config=kernel)
    from lingbot_map_ros.engine.attention.fa3 import Fa3RunAttention
    attend = Fa3RunAttention(config=kernel,
                             kernels=(_fa3_varlen_reference, fa3_forward_reference))
    return TritonBackend(cpu, kernel=attend)


class Tracked:
    """The K/V the cache should show, kept by the test from the protocol's rules.

    Visible: the scale frames' and the newest W keyframes' patches, the specials of every
    cached frame, and a non-keyframe's own tokens while it is in flight.
    """

    def __init__(self, window: int, storage: torch.dtype) -> None:
        self.window, self.storage = window, storage
        # Per frame, per layer: (K, V) ``[P, H, D]`` in float64, as stored.
        self.scale: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        self.keyframes: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

    def stored(self, t: torch.Tensor) -> torch.Tensor:
        """Return ``t`` as the pages hold it, in float64."""
        return t.to(self.storage).double().cpu()

    def visible(self, layer: int, current: list[tuple[torch.Tensor, torch.Tensor]],
                keyframe: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the visible ``K, V`` of ``layer`` with ``current`` in flight."""
        if keyframe:  # it joins the window, whose oldest frame then leaves it
            window = [*self.keyframes, current][-self.window:]
        else:  # on the spare page, beside a window that may be full
            window = [*self.keyframes[-self.window:], current]
        cached = [*self.scale, *self.keyframes, current]
        patches = [f[layer] for f in [*self.scale, *window]]
        specials = [f[layer] for f in cached]
        k = torch.cat([p[0][NUM_SPECIAL_TOKENS:] for p in patches]
                      + [s[0][:NUM_SPECIAL_TOKENS] for s in specials])
        v = torch.cat([p[1][NUM_SPECIAL_TOKENS:] for p in patches]
                      + [s[1][:NUM_SPECIAL_TOKENS] for s in specials])
        return k, v


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(D)) v`` in float64: ``[Q, H, D]`` x ``[K, H, D]``."""
    scores = torch.einsum('qhd,khd->hqk', q.double().cpu(), k) / math.sqrt(q.shape[-1])
    return torch.einsum('hqk,khd->qhd', scores.softmax(-1), v)


def _relative(out: torch.Tensor, want: torch.Tensor) -> float:
    out, want = out.double().cpu(), want.double().cpu()
    return ((out - want).norm() / want.norm()).item()


@dataclass
class Run:
    """What a case's stream went through and its worst error per kind of layout."""

    worst: dict[str, float]
    special_pages: int
    keys: set[Any]
    dtypes: set[torch.dtype]


def drive(case: Case, config: Any, image_hw: tuple[int, int], seed: int = 0) -> Run:
    """Stream the schedule through ``case``'s backend; compare each output (module docstring).

    ``config``: an ``EngineConfig`` (heads, head dim, patch size, N_s, W); ``image_hw``: the
    network input, which sets the page size.
    """
    device = torch.device('cuda' if case.where == 'cuda' else 'cpu')
    dtype = getattr(torch, case.dtype)
    kernel = KernelConfig(**dict(case.kernel))
    model, cache = config.model, config.cache
    tokens = tokens_per_frame(model, image_hw)
    page_size = tokens - NUM_SPECIAL_TOKENS
    backend = _interpreted_backend(case, kernel) if case.where == 'interpret' else case.backend
    pool = KVPool(num_layers=LAYERS, num_pages=stream_pages(
                      page_size, NUM_SPECIAL_TOKENS, cache.scale_frames, cache.sliding_window,
                      cache.max_total_frames),
                  page_size=page_size, num_heads=model.num_heads, head_dim=model.head_dim,
                  num_special_tokens=NUM_SPECIAL_TOKENS, dtype=dtype, device=device,
                  backend=backend, storage_dtype=FP8 if case.fp8 else None,
                  full_patch_pages=cache.scale_frames + cache.sliding_window,
                  precision=case.precision, kernel=kernel)
    kv = StreamKV.for_cache(pool, cache)
    staging = StagedFrames(pool) if case.form == 'staged' else None
    reference = ReferenceBackend()
    tracked = Tracked(cache.sliding_window, pool.storage_dtype)
    gen = torch.Generator().manual_seed(seed)

    def frame(count: int = 1) -> list[torch.Tensor]:
        shape = (3, count * tokens, model.num_heads, model.head_dim)
        return [torch.randn(shape, generator=gen).to(device, dtype) for _ in range(LAYERS)]

    # The scale pass: N_s frames written in one call (their attention is dense, in the model).
    plan = kv.plan_frame('scale', cache.scale_frames)
    scale = frame(cache.scale_frames)
    for layer in range(LAYERS):
        kv.write(plan, layer, scale[layer][1], scale[layer][2])
    kv.end_frame(plan)
    for i in range(cache.scale_frames):
        rows = slice(i * tokens, (i + 1) * tokens)
        tracked.scale.append([(tracked.stored(scale[layer][1][rows]),
                               tracked.stored(scale[layer][2][rows])) for layer in range(LAYERS)])

    run = Run({}, 0, set(), set())
    keyframe_pages: set[int] = set()
    for keyframe in SCHEDULE:
        if staging is None:
            plan = kv.plan_frame('keyframe' if keyframe else 'non-keyframe')
            index = plan.index
        else:
            key = staging.stage_frame(kv, keyframe)
            run.keys.add(key)
            index = staging.index
        layout = kv.table.layout
        page = int(index[NUM_SPECIAL_TOKENS]) // page_size
        if len(tracked.keyframes) < cache.sliding_window:
            kind = 'filling'
        elif keyframe and page in keyframe_pages:
            kind = 'recycled'  # it took the page of the window frame it evicted
        else:
            kind = 'full'
        if keyframe:
            keyframe_pages.add(page)
        qkv = frame()
        current = [(tracked.stored(qkv[layer][1]), tracked.stored(qkv[layer][2]))
                   for layer in range(LAYERS)]
        for layer in range(LAYERS):
            q, k, v = qkv[layer]
            if staging is None:
                kv.write(plan, layer, k, v)
                out = kv.attend(plan, layer, q)
            else:
                staging.write(layer, k, v)
                out = staging.attend(layer, key, q)
            if case.backend == 'reference':
                want = dense_attention(q, *tracked.visible(layer, current, keyframe))
            else:
                storage = pool.storage
                want = reference.run(q, storage.k[layer], storage.v[layer], layout)
            assert out.shape == q.shape and torch.isfinite(out).all(), case.id
            run.dtypes.add(out.dtype)
            run.worst[kind] = max(run.worst.get(kind, 0.0), _relative(out, want))
        if staging is None:
            kv.end_frame(plan)
        else:
            staging.finish()
        if keyframe:
            tracked.keyframes.append(current)
        run.special_pages = layout.num_special_pages
    return run


def _expected_dtype(case: Case) -> torch.dtype:
    """Return the output dtype: the attention dtype; 'reference' upcasts to float32."""
    if case.backend == 'reference' and case.dtype != 'float64':
        return torch.float32
    return getattr(torch, case.dtype)


@pytest.mark.parametrize('case,size', _params())
def test_backend_matches_reference_through_the_cache_protocol(case, size, tiny_config):
    _skip_unless_runnable(case)
    if case.where == 'interpret':
        # TRITON_INTERPRET was read where the kernels were defined: they run interpreted.
        from lingbot_map_ros.engine.attention import triton_attention
        from triton.runtime.interpreter import InterpretedFunction
        assert isinstance(triton_attention.merge_parts, InterpretedFunction)
    model, image_hw = SIZES[size]
    run = drive(case, tiny_config(STREAM, model), image_hw)
    # The stream went through every kind of layout (the tiny one's specials over two pages).
    assert set(run.worst) == {'filling', 'full', 'recycled'}, case.id
    assert run.special_pages == (2 if size == 'tiny' else 1)
    assert run.dtypes == {_expected_dtype(case)}
    for kind, error in run.worst.items():
        assert error < case.tol, f'{case.id}: {kind} layouts off by {error:.3g} ({case.why})'
    if case.form == 'staged' and case.backend == 'sdpa' and case.where == 'cuda':
        # Full-window frames take the cuDNN + flash split: its fixed-shape keys were staged.
        assert {key[0] for key in run.keys} == {'range', 'split'}


def test_every_tolerance_would_catch_a_page_left_out(tiny_config):
    # Attention without one window page differs from the full layout's by far more than the
    # loosest tolerance of the list: a backend that dropped or misplaced a page would fail.
    model = tiny_config(STREAM).model
    tokens = tokens_per_frame(model, SIZES['tiny'][1])
    page_size = tokens - NUM_SPECIAL_TOKENS
    gen = torch.Generator().manual_seed(1)
    k, v = (torch.randn(9, page_size, model.num_heads, model.head_dim, generator=gen)
            for _ in range(2))
    q = torch.randn(tokens, model.num_heads, model.head_dim, generator=gen)
    full = PageLayout.build(tuple(range(9)), page_size, 12, 9, 2, 5, version=1)
    short = PageLayout.build((0, 1, 2, 3, 4, 5, 7, 8), page_size, 12, 9, 2, 4, version=2)
    reference = ReferenceBackend()
    gap = _relative(reference.run(q, k, v, short), reference.run(q, k, v, full))
    assert gap > 2 * max(case.tol for case in CASES)
