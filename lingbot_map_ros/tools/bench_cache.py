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
"""``lingbot_map_bench cache``: one cache-attention layer and the cache's host work per frame.

What it measures and why: attention of a frame over the KV cache is about 76% of a streaming
frame's FLOPs (model spec 9.3), and upstream's manager also spends host time per frame and
layer on page bookkeeping and FlashInfer planning. At the default streaming shape (972 patches
+ 6 specials per frame, 8 scale + 64 window frames, 500 frames in the special stream, 16 heads
x 64, bf16) it reports, for each attention backend:

* ``ms_per_layer`` and ``tflops``: one ``compute_attention`` of a keyframe's ``P`` queries over
  ``(N_s + W) * patches + 6 * frames`` keys, timed with CUDA events after a warm-up (FLOPs =
  4 * P * keys * heads * head_dim);
* ``host_us_keyframe``: wall-clock host time of ``append_frame`` + ``evict_frames`` + ``plan``
  over all ``--layers`` blocks for one keyframe (not waiting for the GPU), averaged over
  ``--host-frames`` frames in steady state; ``host_us_non_keyframe`` likewise for
  ``append_frame`` + ``plan`` + ``rollback_last_frame``; ``host_us_writes``: the K/V writes
  alone (two ``index_copy_`` launches per layer), the floor of any eager per-layer append;
  ``host_us_bookkeeping``: a keyframe's page-table steps and one plan, without tensor writes
  (what upstream repeats per layer, plus its plan).

A ``dense`` row times torch SDPA over contiguous K/V of the same length: the kernel's roofline
without any cache. The last line printed is one JSON document.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

from lingbot_map_ros.engine.attention.backend import make_backend
from lingbot_map_ros.engine.attention.flashinfer import import_flashinfer
from lingbot_map_ros.engine.cache import FlashInferKVCacheManager, TwoStreamPageTable
from lingbot_map_ros.engine.cache.kv_storage import KVStorage
import torch
import torch.nn.functional as F

SPECIALS = 6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags of the ``cache`` subcommand to ``parser``."""
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='torch device (default: cuda when available)')
    parser.add_argument('--dtype', default='bfloat16',
                        choices=['bfloat16', 'float16', 'float32', 'float64'],
                        help='KV storage dtype')
    parser.add_argument('--backends', nargs='+', choices=['flashinfer', 'sdpa', 'reference'],
                        help='backends to time (default: all that run on the device)')
    parser.add_argument('--patches', type=int, default=972, help='patch tokens per frame')
    parser.add_argument('--scale-frames', type=int, default=8, help='N_s, pinned frames')
    parser.add_argument('--window', type=int, default=64, help='W, sliding window frames')
    parser.add_argument('--frames', type=int, default=500,
                        help='frames in the special stream when attention is timed')
    parser.add_argument('--heads', type=int, default=16, help='attention heads')
    parser.add_argument('--head-dim', type=int, default=64, help='dims per head')
    parser.add_argument('--layers', type=int, default=24, help='blocks for the host timing')
    parser.add_argument('--iters', type=int, default=20, help='timed attention calls')
    parser.add_argument('--warmup', type=int, default=3, help='untimed calls first')
    parser.add_argument('--host-frames', type=int, default=50,
                        help='frames averaged for the host timing')


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by ``args``; print the table and return the JSON dict."""
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    backends = args.backends or _default_backends(device, dtype)
    tokens = SPECIALS + args.patches
    num_keys = (args.scale_frames + args.window) * args.patches + SPECIALS * args.frames
    flop = 4 * tokens * num_keys * args.heads * args.head_dim
    results: dict[str, dict[str, float]] = {}
    for name in backends:
        ms = _attention_ms(args, name, device, dtype, num_keys)
        results[name] = {'ms_per_layer': ms, 'tflops': flop / ms / 1e9,
                         **_host_us(args, name, device, dtype)}
    ms = _dense_ms(args, device, dtype, tokens, num_keys)
    results['dense'] = {'ms_per_layer': ms, 'tflops': flop / ms / 1e9}
    result = {
        'bench': 'cache', 'device': _device_name(device), 'dtype': args.dtype,
        'shape': {'patches': args.patches, 'specials': SPECIALS, 'tokens_per_frame': tokens,
                  'scale_frames': args.scale_frames, 'window': args.window,
                  'frames': args.frames, 'heads': args.heads, 'head_dim': args.head_dim,
                  'layers': args.layers},
        'num_keys': num_keys, 'results': results,
    }
    _print_table(result)
    return result


def _default_backends(device: torch.device, dtype: torch.dtype) -> list[str]:
    names = ['sdpa', 'reference']
    if device.type == 'cuda' and dtype in (torch.bfloat16, torch.float16):
        try:
            import_flashinfer()
            names.insert(0, 'flashinfer')
        except ImportError:
            print('flashinfer: not installed, not timed')
    return names


def _manager(args: argparse.Namespace, backend: str, device: torch.device,
             dtype: torch.dtype, num_blocks: int, num_frames: int) -> FlashInferKVCacheManager:
    return FlashInferKVCacheManager(
        num_blocks=num_blocks, max_num_frames=num_frames, tokens_per_frame=SPECIALS
        + args.patches, num_heads=args.heads, head_dim=args.head_dim, dtype=dtype,
        device=device, scale_frames=args.scale_frames, sliding_window=args.window,
        max_total_frames=num_frames, backend=backend)


def _keyframe(manager: FlashInferKVCacheManager, kv: torch.Tensor, plan: bool) -> None:
    for block in range(manager.num_blocks):
        manager.append_frame(block, kv, kv, keyframe=True)
        manager.evict_frames(block)
        if plan:
            manager.plan(block)


def _non_keyframe(manager: FlashInferKVCacheManager, kv: torch.Tensor) -> None:
    for block in range(manager.num_blocks):
        manager.append_frame(block, kv, kv, keyframe=False)
        manager.plan(block)
        manager.rollback_last_frame(block)


def _attention_ms(args: argparse.Namespace, backend: str, device: torch.device,
                  dtype: torch.dtype, num_keys: int) -> float:
    manager = _manager(args, backend, device, dtype, 1, args.frames)
    kv = torch.randn(manager.tokens_per_frame, args.heads, args.head_dim, device=device,
                     dtype=dtype)
    for _ in range(args.frames):
        _keyframe(manager, kv, plan=False)
    if manager.layout(0).num_tokens != num_keys:
        raise RuntimeError(f'cache holds {manager.layout(0).num_tokens} keys, '
                           f'expected {num_keys}')
    return _time_ms(lambda: manager.compute_attention(0, kv), device, args)


def _dense_ms(args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
              tokens: int, num_keys: int) -> float:
    q = torch.randn(1, args.heads, tokens, args.head_dim, device=device, dtype=dtype)
    k = torch.randn(1, args.heads, num_keys, args.head_dim, device=device, dtype=dtype)
    return _time_ms(lambda: F.scaled_dot_product_attention(q, k, k), device, args)


def _host_us(args: argparse.Namespace, backend: str, device: torch.device,
             dtype: torch.dtype) -> dict[str, float]:
    steady = args.scale_frames + args.window + 1
    num_frames = steady + 2 * args.host_frames
    manager = _manager(args, backend, device, dtype, args.layers, num_frames)
    kv = torch.randn(manager.tokens_per_frame, args.heads, args.head_dim, device=device,
                     dtype=dtype)
    for _ in range(steady):
        _keyframe(manager, kv, plan=True)
    keyframe_us = _host_time_us(lambda: _keyframe(manager, kv, plan=True), device, args)
    non_keyframe_us = _host_time_us(lambda: _non_keyframe(manager, kv), device, args)
    # The tensor writes alone: one index_copy_ for K and one for V per layer.
    storage = KVStorage(args.layers, 2, args.patches, args.heads, args.head_dim, SPECIALS,
                        dtype, device)

    def writes() -> None:
        index = storage.frame_index(0, args.patches)
        for layer in range(args.layers):
            storage.write(layer, index, kv, kv)

    writes_us = _host_time_us(writes, device, args)
    # A keyframe's page-table steps and one plan, without any tensor write.
    table = TwoStreamPageTable(args.patches, SPECIALS, args.scale_frames, args.window,
                               num_frames)
    planner = make_backend(backend, num_heads=args.heads, head_dim=args.head_dim,
                           page_size=args.patches, num_pages=table.num_pages, dtype=dtype,
                           device=device)

    def bookkeeping() -> None:
        table.append(keyframe=True)
        table.evict()
        planner.plan(table.layout, SPECIALS + args.patches)

    for _ in range(steady):
        bookkeeping()
    bookkeeping_us = _host_time_us(bookkeeping, device, args)
    return {'host_us_keyframe': keyframe_us, 'host_us_non_keyframe': non_keyframe_us,
            'host_us_writes': writes_us, 'host_us_bookkeeping': bookkeeping_us}


def _host_time_us(step: Callable[[], Any], device: torch.device,
                  args: argparse.Namespace) -> float:
    total = 0.0
    for _ in range(args.host_frames):
        _sync(device)
        start = time.perf_counter()
        step()
        total += time.perf_counter() - start
    _sync(device)
    return total / args.host_frames * 1e6


def _time_ms(call: Callable[[], Any], device: torch.device, args: argparse.Namespace) -> float:
    for _ in range(args.warmup):
        call()
    _sync(device)
    if device.type == 'cuda':
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            call()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / args.iters
    begin = time.perf_counter()
    for _ in range(args.iters):
        call()
    return (time.perf_counter() - begin) * 1e3 / args.iters


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _device_name(device: torch.device) -> str:
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    return str(device)


def _print_table(result: dict[str, Any]) -> None:
    shape = result['shape']
    print(f"cache attention, {result['device']}, {result['dtype']}: {shape['patches']} patches "
          f"+ {SPECIALS} specials, {shape['scale_frames']} scale + {shape['window']} window "
          f"frames, {shape['frames']} frames of specials = {result['num_keys']} keys, "
          f"{shape['heads']} heads x {shape['head_dim']}; host time over {shape['layers']} "
          'layers')
    columns = ('ms_per_layer', 'tflops', 'host_us_keyframe', 'host_us_non_keyframe',
               'host_us_writes', 'host_us_bookkeeping')
    print(f"{'backend':<11}" + ''.join(f'{c:>21}' for c in columns))
    for name, row in result['results'].items():
        cells = ''.join(f'{row[c]:>21.3f}' if c in row else f"{'-':>21}" for c in columns)
        print(f'{name:<11}{cells}')
    print(json.dumps(result, sort_keys=True))
