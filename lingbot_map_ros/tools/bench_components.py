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
"""``lingbot_map_bench model --components N``: each part of a frame against its floor.

What and why: time is only worth cutting where it is far above what the chip could do. For each
part of a streaming frame (cache attention, cache K/V writes, each linear group, DINO and frame
attention, norms, RoPE and other elementwise work, camera head, DPT head) this counts the FLOPs
(matrix products, attention) and the fewest bytes (each operator's inputs read once, outputs
written once) from the shapes the frame runs, turns them into a floor with two ceilings measured
in the same run (a bf16 8192^3 GEMM, a 1 GiB device copy counted read + write; float32 512^3 and
64 MiB on the CPU), and sets the measured time next to it:

- Counting: a ``TorchDispatchMode`` sees every aten operator of ``N`` eager frames with its
  shapes; module hooks say which module it runs in. The cache attention is counted from its
  layout (``4 Q H D K`` FLOPs; Q, the visible K/V and the output in bytes): its kernel may be
  our Triton kernel, which aten does not see.
- Time per part: the device time of the part's kernels (CUDA profiler, eager mode; each kernel
  goes to the part whose GPU-side range holds it, :func:`kernel_ms_by_part`). CUDA events
  around parts in eager mode would time the host issuing thousands of small launches, not the
  GPU. On the CPU: the host time of the part's operators.
- Whole frame: ``N`` frames through the configured path (graphs, compiled or not), CUDA events,
  median. ``gaps`` = that minus the sum of the parts: launch gaps inside the graphs, host work,
  and what the compiled path fuses (norms, elementwise) against the eager kernels.

Floors count matrix FLOPs at the GEMM ceiling and bytes at the copy ceiling, whichever is
larger; elementwise FLOPs and softmax exponentials are not in them (docs/performance.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
import time
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

_ATTENTION_OPS = ('scaled_dot_product', '_flash_attention_forward',
                  '_efficient_attention_forward')
_MATMUL_OPS = ('mm', 'addmm', 'bmm', 'baddbmm')
_FREE_OPS = ('empty', 'empty_like', 'empty_strided', 'zeros', 'zeros_like', 'ones', 'full',
             'scalar_tensor', 'lift_fresh', 'arange', 'set_', 'record_stream')
PART_ORDER = ('cache attention', 'cache K/V writes', 'linear DINO qkv+proj', 'linear DINO mlp',
              'linear frame qkv+proj', 'linear frame mlp', 'linear global qkv+proj',
              'linear global mlp', 'DINO attention', 'frame attention', 'patch embed', 'norms',
              'RoPE + elementwise', 'camera head', 'DPT head', 'other')


def measure_ceilings(device: torch.device) -> dict[str, float]:
    """Measure the GEMM rate (TFLOP/s) and copy bandwidth (GB/s, read + write) of ``device``."""
    cuda = device.type == 'cuda'
    n = 8192 if cuda else 512
    dtype = torch.bfloat16 if cuda else torch.float32
    size = (1 << 30) if cuda else (64 << 20)
    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, device=device, dtype=dtype, generator=gen) for _ in range(2))
    product = torch.empty(n, n, device=device, dtype=dtype)
    gemm_ms = _median_ms(lambda: torch.mm(a, b, out=product), device)
    src = torch.randint(0, 255, (size,), device=device, dtype=torch.uint8, generator=gen)
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src), device)
    return {'gemm_tflops': round(2 * n**3 / gemm_ms / 1e9, 4),
            'copy_gbps': round(2 * size / copy_ms / 1e6, 1),
            'gemm_shape': n, 'gemm_dtype': str(dtype).replace('torch.', ''),
            'copy_bytes': size}


def _median_ms(fn: Callable[[], Any], device: torch.device, reps: int = 20,
               warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == 'cuda':
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
    return float(np.median(times))


def classify(path: str, op: str) -> str:
    """Name the part of an aten operator ``op`` run inside the module at ``path``."""
    if path.startswith('camera_head'):
        return 'camera head'
    if path.startswith('depth_head'):
        return 'DPT head'
    if not path.startswith('aggregator'):
        return 'other'
    group = ('DINO' if '.patch_embed' in path else 'frame' if '.frame_blocks.' in path
             else 'global' if '.global_blocks.' in path else None)
    leaf = path.rsplit('.', 1)[-1]
    if op in _MATMUL_OPS and group is not None:
        if leaf in ('qkv', 'proj'):
            return f'linear {group} qkv+proj'
        if leaf in ('fc1', 'fc2'):
            return f'linear {group} mlp'
    if any(key in op for key in _ATTENTION_OPS) and group in ('DINO', 'frame'):
        return f'{group} attention'
    if 'convolution' in op:
        return 'patch embed'
    if 'layer_norm' in op:
        return 'norms'
    return 'RoPE + elementwise'


def attention_flops(q_shape: tuple[int, ...], k_shape: tuple[int, ...],
                    v_dim: int) -> int:
    """Count the FLOPs of softmax attention: ``2 L S (E + Ev)`` per batch and head.

    Shapes are ``[..., L, E]`` and ``[..., S, E]`` with the same leading dims (B, H).
    """
    lead = int(np.prod(q_shape[:-2])) if len(q_shape) > 2 else 1
    return 2 * lead * q_shape[-2] * k_shape[-2] * (q_shape[-1] + v_dim)


def _tensor_bytes(values: Any) -> int:
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    return sum(map(_tensor_bytes, values)) if isinstance(values, (list, tuple)) else 0


class _Counter(TorchDispatchMode):
    """Count the FLOPs and bytes of every aten op by part; time it with a profiler range."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__()
        self.stack = stack
        self.flops: dict[str, float] = defaultdict(float)
        self.bytes: dict[str, float] = defaultdict(float)
        self.fixed: str | None = None
        """A part counted by formula (cache attention): its ops add nothing, one range."""
        self.keys = 0
        """Visible keys of the last cache attention."""
        self.forced: str | None = None
        """A part that every op counts towards while it is set (cache writes)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if func.namespace == 'profiler' or self.fixed is not None:
            return func(*args, **kwargs)
        part = self.forced or classify(self.stack[-1] if self.stack else '', name)
        with torch.profiler.record_function(f'part::{part}'):
            out = func(*args, **kwargs)
        if func.is_view or name in _FREE_OPS:
            return out
        formula = flop_registry.get(func.overloadpacket)
        if formula is not None and (name in _MATMUL_OPS or 'convolution' in name):
            self.flops[part] += formula(*args, **kwargs, out_val=out)
        elif any(key in name for key in _ATTENTION_OPS):
            q, k, v = args[:3]
            self.flops[part] += attention_flops(tuple(q.shape), tuple(k.shape), v.shape[-1])
        if name.endswith('_'):  # in place: read the sources, write as much into self
            self.bytes[part] += 2 * _tensor_bytes(list(args[1:]) + list(kwargs.values()))
        else:
            self.bytes[part] += _tensor_bytes(list(args) + list(kwargs.values())) \
                + _tensor_bytes(out)
        return out


def _instrument(kv: Any, counter: _Counter) -> Callable[[], None]:
    """Wrap the calls that no module hook sees; return a function that undoes it.

    The cache attention (``kv``: the stream's ``StreamKV``) is counted by its layout and timed
    as one range; the cache's K/V writes (page copies) are their own part. The frames counted
    run on the model's eager forward (the runner's 'eager' mode), through every module's
    ``__call__``: the module hooks see the rest.
    """
    attend = kv.attend

    def in_part(part: str, fn: Callable[..., Any], fixed: bool) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not fixed:
                counter.forced = part
                try:
                    return fn(*args, **kwargs)
                finally:
                    counter.forced = None
            with torch.profiler.record_function(f'part::{part}'):
                counter.fixed = part
                try:
                    return fn(*args, **kwargs)
                finally:
                    counter.fixed = None
        return call

    def cache_attention(plan: Any, layer: int, q: torch.Tensor) -> torch.Tensor:
        keys = plan.layout.num_tokens
        num_q, heads, dim = q.shape
        kv_size = torch.empty((), dtype=kv.pool.storage_dtype).element_size()
        counter.flops['cache attention'] += 4 * num_q * heads * dim * keys
        counter.bytes['cache attention'] += heads * dim * (
            2 * num_q * q.element_size() + 2 * keys * kv_size)
        counter.keys = keys
        return in_part('cache attention', attend, fixed=True)(plan, layer, q)

    wrappers = {(kv, 'attend'): cache_attention,
                (kv, 'write'): in_part('cache K/V writes', kv.write, fixed=False)}
    for (obj, name), wrapper in wrappers.items():
        setattr(obj, name, wrapper)

    def undo() -> None:
        for obj, name in wrappers:
            delattr(obj, name)
    return undo


def _module_hooks(model: torch.nn.Module, stack: list[str]) -> list[Any]:
    def enter(name: str) -> Callable[..., None]:
        def hook(_module: Any, _args: Any) -> None:
            stack.append(name)
        return hook

    def leave(_module: Any, _args: Any, _out: Any) -> None:
        stack.pop()

    handles = []
    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave))
    return handles


def _graphed_ms(step: Callable[[int], Any], count: int, device: torch.device) -> float:
    """Median ms of ``count`` frames through the session's configured path."""
    times = []
    for i in range(count):
        times.append(_median_ms(lambda i=i: step(i), device, reps=1, warmup=0))
    return float(np.median(times))


def _profile_parts(session: Any, step: Callable[[int], Any], count: int,
                   device: torch.device) -> tuple[_Counter, dict[str, float], float]:
    """Run ``count`` eager frames counted and profiled; per-part ms summed over them."""
    from torch.profiler import profile, ProfilerActivity

    model = session.model
    stack: list[str] = []
    counter = _Counter(stack)
    cuda = device.type == 'cuda'
    handles = _module_hooks(model, stack)
    undo = _instrument(session.session.stream.state.kv, counter)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with profile(activities=activities) as prof:
            for i in range(count):
                with counter:
                    step(i)
        if cuda:
            torch.cuda.synchronize(device)
    finally:
        undo()
        for handle in handles:
            handle.remove()
    if cuda:
        measured, all_kernels_ms = kernel_ms_by_part(prof.events())
    else:
        measured, all_kernels_ms = defaultdict(float), 0.0
        for event in prof.events():
            if event.name.startswith('part::'):
                measured[event.name[len('part::'):]] += event.cpu_time_total / 1e3
    return counter, measured, all_kernels_ms


def kernel_ms_by_part(events: Any) -> tuple[dict[str, float], float]:
    """Sum each kernel's device time into the part whose GPU-side range holds its start.

    By time, not through the CPU operators: Triton launches through the driver API, linked to
    no CPU operator. A range's GPU-side annotation is not a kernel (counted as one, it would
    double every part but the Triton attention). Ranges on a stream do not overlap.

    Returns:
        ``({part: ms}, ms of all kernels)``.
    """
    spans, kernels = [], []
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        window = (event.time_range.start, event.time_range.end)
        if event.is_user_annotation:
            if event.name.startswith('part::'):
                spans.append(window + (event.name[len('part::'):],))
        else:
            kernels.append(window)
    spans.sort()
    starts = [span[0] for span in spans]
    measured: dict[str, float] = defaultdict(float)
    for begin, end in kernels:
        i = int(np.searchsorted(starts, begin, side='right')) - 1
        if i >= 0 and begin < spans[i][1]:
            measured[spans[i][2]] += (end - begin) / 1e3
    return measured, sum(end - begin for begin, end in kernels) / 1e3


def components_report(session: Any, step: Callable[[int], Any], count: int,
                      device: torch.device) -> dict[str, Any]:
    """Floors and measured times of each part of a streaming frame (see the module doc).

    Args:
        session: a warmed-up session (``session.model`` and the cache attached), mid-stream
            (the cache as the frames to measure should see it: e.g. the window full).
        step: ``step(i)`` feeds the session its next streaming frame.
        count: frames per measurement (graphed, then eager counted and profiled).
        device: the session's device.

    Returns:
        ``{'ceilings', 'parts': [{'part', 'flops', 'bytes', 'gflop', 'mbytes', 'floor_ms',
        'measured_ms', 'over_floor_ms', 'bound'}], 'sum_parts_ms', 'graphed_frame_ms', 'gaps_ms',
        'unattributed_kernel_ms', 'cache_keys', 'frames'}``; per frame.
    """
    ceilings = measure_ceilings(device)
    graphed = _graphed_ms(step, count, device)
    fast_path = session.session.engine.fast_path
    saved = fast_path.mode  # put back exactly, step-downs included
    fast_path.request('eager', False)
    try:
        step(count)  # one eager frame first: one-off costs (eager kernels' plans) stay out
        counter, measured, all_kernels = _profile_parts(
            session, lambda i: step(count + 1 + i), count, device)
    finally:
        fast_path.restore(saved)
    rate = ceilings['gemm_tflops'] * 1e12
    bandwidth = ceilings['copy_gbps'] * 1e9
    parts = []
    names = [p for p in PART_ORDER if p in measured or p in counter.bytes]
    names += sorted((set(measured) | set(counter.bytes)) - set(names))
    for name in names:
        flops, nbytes = counter.flops[name] / count, counter.bytes[name] / count
        math_ms, memory_ms = flops / rate * 1e3, nbytes / bandwidth * 1e3
        ms = measured.get(name, 0.0) / count
        parts.append({'part': name, 'flops': int(flops), 'bytes': int(nbytes),
                      'gflop': round(flops / 1e9, 4),
                      'mbytes': round(nbytes / 1e6, 3),
                      'floor_ms': round(max(math_ms, memory_ms), 4),
                      'measured_ms': round(ms, 4),
                      'over_floor_ms': round(ms - max(math_ms, memory_ms), 4),
                      'bound': 'math' if math_ms >= memory_ms else 'memory'})
    total = sum(p['measured_ms'] for p in parts)
    report = {'ceilings': ceilings, 'parts': parts, 'sum_parts_ms': round(total, 3),
              'graphed_frame_ms': round(graphed, 3), 'gaps_ms': round(graphed - total, 3),
              'floor_ms': round(sum(p['floor_ms'] for p in parts), 3),
              'cache_keys': counter.keys, 'frames': count, 'fast_path': saved.requested,
              'compile': saved.segments_compile}
    if device.type == 'cuda':
        report['unattributed_kernel_ms'] = round(all_kernels / count - total, 3)
    return report


def format_report(report: dict[str, Any]) -> str:
    """Format the report as a text table (largest time over floor first)."""
    c = report['ceilings']
    lines = [f"ceilings: GEMM {c['gemm_tflops']} TFLOP/s ({c['gemm_dtype']} {c['gemm_shape']}^3),"
             f" copy {c['copy_gbps']} GB/s (read + write); {report['frames']} frames, "
             f"cache attention over {report['cache_keys']} keys",
             f"{'part':24s} {'GFLOP':>9s} {'MB':>9s} {'floor ms':>9s} {'measured':>9s} "
             f"{'over':>8s}  bound"]
    for p in sorted(report['parts'], key=lambda p: -p['over_floor_ms']):
        lines.append(f"{p['part']:24s} {p['gflop']:9.2f} {p['mbytes']:9.1f} "
                     f"{p['floor_ms']:9.3f} {p['measured_ms']:9.3f} {p['over_floor_ms']:8.3f}"
                     f"  {p['bound']}")
    lines.append(f"{'sum of parts':24s} {'':9s} {'':9s} {report['floor_ms']:9.3f} "
                 f"{report['sum_parts_ms']:9.3f}")
    lines.append(f"whole frame ({report['fast_path']}, compile {report['compile']}): "
                 f"{report['graphed_frame_ms']:.3f} ms; gaps (whole - parts) "
                 f"{report['gaps_ms']:.3f} ms")
    if 'unattributed_kernel_ms' in report:
        lines.append(f"kernels outside every part: {report['unattributed_kernel_ms']:.3f} ms")
    return '\n'.join(lines)
