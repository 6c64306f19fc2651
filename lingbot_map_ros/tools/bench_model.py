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
"""``lingbot_map_bench model``: streaming frame rate of the whole model, frame by frame.

What it measures and why: a robot needs to know how many camera frames per second the node can
map, and whether that rate holds over a long run as the trajectory memory (6 special tokens per
keyframe) grows. This drives a real :class:`StreamingSession` with random (golden-formula)
weights on synthetic frames that already sit on the device, exactly as the node would after
decoding: phase 1 (the N_s scale frames together), then one call per frame with the keyframe
schedule. Each call is timed with CUDA events and followed by a device sync, so a frame's time
is its full latency (aggregator + camera head + optional depth head + the host work between
kernels). Image decoding and preprocessing are not timed (the node does them on another path).

Long runs go through the node's rollover layer (``engine/session/rollover.py``), so ``--frames
20000`` runs with bounded memory; ``--progress N`` prints each N frames' mean ms and peak GPU
memory. The JSON's ``long_run`` (``tools/bench_rollover.py``): block means, flatness, the rollover
and preparation frames' latency; its ``HEADLINE_KEYS`` are also at the JSON's top level.

Reported: global FPS (all frames incl. phase 1 over total time), windowed FPS around 10/50/90 %
of the run and over the last frames, p50/p90/max ms per streaming frame, peak GPU memory, cache
statistics. The last line printed is one JSON document.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import time
import typing
from typing import Any

from lingbot_map_ros.config import CacheConfig, EngineConfig, ModelConfig, Precision, \
    StreamConfig
from lingbot_map_ros.engine.attention.backend import BACKEND_NAMES
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.kernel_config import kernel_from_json
from lingbot_map_ros.tools.bench_cameras import run_cameras, synthetic_frames
from lingbot_map_ros.tools.bench_components import components_report, format_report
from lingbot_map_ros.tools.bench_rollover import add_live_arguments, block_report, \
    HEADLINE_KEYS, live_drop_report
from lingbot_map_ros.tools.bench_spans import LaunchClock, PartEvents
from lingbot_map_ros.tools.bench_timeline import print_profile
from lingbot_map_ros.tools.fast_path_flags import add_fast_path_flags
import numpy as np
import torch

_LOG = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags of the ``model`` subcommand to ``parser``."""
    parser.add_argument('--preset', default='official', choices=['official', 'tiny'],
                        help='model size (official = the released checkpoint shape)')
    parser.add_argument('--height', type=int, default=378, help='processed image height (px)')
    parser.add_argument('--width', type=int, default=504, help='processed image width (px)')
    parser.add_argument('--frames', type=int, default=200, help='frames to time, phase 1 incl.')
    parser.add_argument('--warmup', type=int, default=None,
                        help='untimed frames (a stream, then a reset) before timing; default '
                             'N_s + W + 10, past the window fill, so one-off costs (compilation, '
                             'graph capture, kernel plans of the full window) stay out of the '
                             'timed frames')
    parser.add_argument('--scale-frames', type=int, default=8, help='N_s')
    parser.add_argument('--window', type=int, default=64, help='sliding window W (keyframes)')
    parser.add_argument('--keyframe-interval', type=int, default=1, help='K')
    parser.add_argument('--session-keyframes', type=int,
                        default=StreamConfig.session_keyframes,
                        help='keyframes per session before a rollover (stream.session_keyframes)')
    parser.add_argument('--overlap-keyframes', type=int,
                        default=StreamConfig.overlap_keyframes,
                        help='keyframes run again at a rollover (stream.overlap_keyframes)')
    parser.add_argument('--backend', default=CacheConfig.backend,
                        choices=list(BACKEND_NAMES),
                        help='cache attention')
    parser.add_argument('--dtype', default='bfloat16', choices=['bfloat16', 'float16', 'float32'],
                        help='aggregator compute and KV dtype (depth head float32; camera head: '
                             '--camera-head-dtype)')
    parser.add_argument('--camera-head-dtype', default=StreamConfig.camera_head_dtype,
                        choices=['float32', 'bfloat16'],
                        help="stream.camera_head_dtype: the camera head's trunk in bf16")
    parser.add_argument('--kv-dtype', default=None, choices=['bfloat16', 'float8_e4m3fn'],
                        help='cache.dtype (default: --dtype); float8_e4m3fn halves the KV cache')
    parser.add_argument('--precision', default=CacheConfig.precision,
                        choices=typing.get_args(Precision),
                        help='cache.precision: fast_approximate also allows the FP8 products '
                        'that fail the fidelity gate (docs/performance.md)')
    parser.add_argument('--kernel', default='{}', metavar='JSON',
                        help='cache.kernel fields to replace, a JSON object (e.g. '
                        '\'{"triton_splits": 1}\', \'{"staged_runs": false}\'; '
                        'docs/parameters.md)')
    parser.add_argument('--max-total-frames', type=int, default=CacheConfig.max_total_frames,
                        help='cache.max_total_frames (special-stream capacity in keyframes, '
                             '>= --session-keyframes)')
    parser.add_argument('--depth', action=argparse.BooleanOptionalAction, default=False,
                        help='run the DPT depth head on every frame')
    parser.add_argument('--device', default='cuda', help='torch device')
    parser.add_argument('--seed', type=int, default=0, help='random-weights salt')
    parser.add_argument('--weights', default=None,
                        help='checkpoint to load instead of random weights (same speed; saves '
                             'generating the random weights again in repeated runs)')
    parser.add_argument('--report-window', type=int, default=30,
                        help='frames on each side of the 10/50/90 %% marks for windowed FPS')
    add_fast_path_flags(parser, 'whole_frame', 'stream.fast_path: upper bound of how frames '
                        'run (the backend caps it)')
    parser.add_argument('--compile', action=argparse.BooleanOptionalAction, default=False,
                        help="torch.compile each frame's fixed-shape work (Inductor) before "
                             'capture; compiled during warm-up')
    parser.add_argument('--progress', type=int, default=0, metavar='N',
                        help='log the mean ms of every N frames while running (long runs)')
    parser.add_argument('--components', type=int, default=0, metavar='N',
                        help='after the timed run, time N more streaming frames part by part '
                             '(aggregator, camera head, depth head; CUDA events), then the '
                             'floors table: FLOPs, bytes, floor and measured time of every part '
                             'of a frame (tools/bench_components.py)')
    parser.add_argument('--host-timing', type=int, default=0, metavar='N',
                        help='after the timed run, time N more streaming frames on the host: '
                             'wall time, time before the first CUDA-graph launch, time inside '
                             'the launches (CUDA)')
    add_live_arguments(parser)  # --live-hz, --live-queue
    parser.add_argument('--cameras', type=int, default=0, metavar='N', help='N streams on one '
                        'engine, synced frames batched (bench_cameras.py); 0: one session')
    parser.add_argument('--profile', type=int, default=0, metavar='N',
                        help='after the timed run, profile N more streaming frames with '
                             'torch.profiler and print the top operators by device time')


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by ``args``; print the table and return the JSON dict."""
    if args.cameras:  # several streams on one engine
        return run_cameras(args, engine_config(args))
    config = engine_config(args)
    session = RolloverSession(StreamingSession(config, args.weights,
                                               allow_random_weights=args.weights is None,
                                               seed=args.seed))
    device = torch.device(args.device)
    frames, info = synthetic_frames(args.height, args.width, device)
    warmup = args.scale_frames + args.window + 10 if args.warmup is None else args.warmup
    stream_frames(session, frames, info, warmup, device)
    session.reset()
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    peaks: list[float] = []  # peak GPU memory (GiB) of each progress block
    times_ms, roles = stream_frames(session, frames, info, args.frames, device, args.progress,
                                    peaks)
    result = _summarise(args, times_ms, roles, session, device, peaks)
    at = {k: [i for i, r in enumerate(roles) if f'+{k}' in r] for k in ('rollover', 'prepare')}
    result['long_run'] = block_report(times_ms, at['rollover'], args.window,
                                      args.progress or 100, peaks, at['prepare'])
    result['long_run'].update(live_drop_report(times_ms, at['rollover'], at['prepare'],
                                               args.live_hz, args.live_queue))
    result.update({key: result['long_run'].get(key) for key in HEADLINE_KEYS})
    if args.components and device.type == 'cuda':
        result['components_ms'] = _components(session, frames, info, args.components, device)
    if args.host_timing and device.type == 'cuda':
        result['host_ms'] = _host_timing(session, frames, info, args.host_timing)
    if args.profile:
        print_profile(lambda: stream_frames(session, frames, info, args.profile, device), device)
    if args.components:  # last: it runs eager frames (tools/bench_components.py)
        result['floors'] = components_report(session, lambda i: session.step_tensor(
            frames[i % len(frames)], info, (i + 10**6) * 33_000_000),
            args.components, device)
        print(format_report(result['floors']))
    _print_table(result)
    return result


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """Return the engine configuration of ``args`` (sessions roll over: one session's room)."""
    return EngineConfig(
        model=ModelConfig.from_preset(args.preset),
        cache=CacheConfig(backend=args.backend, scale_frames=args.scale_frames,
                          sliding_window=args.window, max_total_frames=args.max_total_frames,
                          dtype=args.kv_dtype or args.dtype, precision=args.precision,
                          kernel=kernel_from_json(args.kernel)),
        stream=StreamConfig(device=args.device, dtype=args.dtype, image_width=args.width,
                            keyframe_interval=args.keyframe_interval, enable_depth=args.depth,
                            fast_path=args.fast_path, compile=args.compile,
                            camera_head_dtype=args.camera_head_dtype,
                            session_keyframes=args.session_keyframes,
                            overlap_keyframes=args.overlap_keyframes))


def _components(session: RolloverSession, frames: list[torch.Tensor], info: PreprocessInfo,
                count: int, device: torch.device) -> dict[str, float]:
    """Mean device ms per streaming frame of each model part, and of the whole call.

    CUDA events recorded by the engine's step ranges (``bench_spans.PartEvents``) bracket each
    part on the stream; a frame's parts run one after another, so they add up to the model's
    share of the frame time (the rest is host-side: preprocessing hand-off, pose decoding).
    """
    parts = ['aggregator', 'camera head']
    if session.model.depth_head is not None and session.config.stream.enable_depth:
        parts.append('depth head')
    events = PartEvents(parts)
    engine = session.session.engine
    engine.set_profiler(events)
    try:
        times_ms, _ = stream_frames(session, frames, info, count, device)
    finally:
        engine.set_profiler(None)
    torch.cuda.synchronize(device)
    out = {part.replace(' ', '_'): ms for part, ms in events.mean_ms().items()}
    out['frame'] = round(float(np.mean(times_ms)), 3)
    return out


def _host_timing(session: RolloverSession, frames: list[torch.Tensor], info: PreprocessInfo,
                 count: int) -> dict[str, float]:
    """Mean host ms per streaming frame: in all, before the first graph launch, in launches.

    Why: ``bench_spans.LaunchClock``; the engine's 'graph launch' ranges time the launches.
    """
    clock = LaunchClock()
    engine = session.session.engine
    engine.set_profiler(clock)
    wall_s = 0.0
    try:
        for i in range(count):
            clock.start_frame()
            start = time.perf_counter()
            session.step_tensor(frames[i % len(frames)], info, i * 33_000_000)
            torch.cuda.synchronize()
            wall_s += time.perf_counter() - start
    finally:
        engine.set_profiler(None)
    totals = {'wall': wall_s, 'before_first_launch': clock.before_first_launch_s,
              'in_launches': clock.in_launches_s}
    return {name: round(total / count * 1e3, 3) for name, total in totals.items()}


def stream_frames(session: StreamingSession, frames: list[torch.Tensor], info: PreprocessInfo,
                  count: int, device: torch.device, progress: int = 0,
                  peaks: list[float] | None = None) -> tuple[list[float], list[str]]:
    """Feed ``count`` frames; per call, the elapsed ms and the roles it produced.

    With ``progress``, each block of ``progress`` timed calls prints a line (its peak GPU
    memory in GiB appended to ``peaks``).
    """
    times_ms: list[float] = []
    roles: list[str] = []
    cuda = device.type == 'cuda'
    for i in range(count):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        preds = session.step_tensor(frames[i % len(frames)], info, i * 33_000_000)
        if cuda:
            end.record()
            torch.cuda.synchronize(device)
            elapsed = start.elapsed_time(end)
        else:
            elapsed = (time.perf_counter() - t0) * 1e3
        if not preds:
            continue  # a buffered scale frame
        times_ms.append(elapsed)
        tags = ''.join(f'+{k}' for k in ('rollover', 'prepare') if k in preds[0].timings_ms)
        roles.append((preds[0].role if len(preds) == 1 else f'scale x{len(preds)}') + tags)
        # Blocks of timed calls, as block_report cuts times_ms: each peak is its block's.
        if progress and len(times_ms) % progress == 0:
            _progress_line(len(times_ms) - 1, progress, times_ms, roles, device, peaks)
    return times_ms, roles


def _progress_line(i: int, progress: int, times_ms: list[float], roles: list[str],
                   device: torch.device, peaks: list[float] | None) -> None:
    """Print one block's mean ms, peak GPU memory and rollovers; restart the peak counter."""
    peak = ''
    if device.type == 'cuda':
        gib = torch.cuda.max_memory_allocated(device) / 2**30
        if peaks is not None:
            peaks.append(gib)
        torch.cuda.reset_peak_memory_stats(device)
        peak = f', peak {gib:.3f} GiB'
    rolls = sum('+rollover' in r for r in roles[-progress:])
    print(f'frames {i + 1 - progress}..{i}: {np.mean(times_ms[-progress:]):.2f} ms/frame'
          f'{peak}, {rolls} rollover(s)', flush=True)


def _summarise(args: argparse.Namespace, times_ms: list[float], roles: list[str],
               session: RolloverSession, device: torch.device,
               peaks: list[float]) -> dict[str, Any]:
    phase1_ms, stream_ms = times_ms[0], np.asarray(times_ms[1:])
    total_frames = args.frames
    stats = session.stats()
    result: dict[str, Any] = {
        'mode': 'model', 'preset': args.preset, 'height': args.height, 'width': args.width,
        'frames': total_frames, 'scale_frames': args.scale_frames, 'window': args.window,
        'keyframe_interval': args.keyframe_interval, 'backend': args.backend, 'dtype': args.dtype,
        'depth': args.depth, 'camera_head_dtype': args.camera_head_dtype,
        'cuda_graphs': stats.cuda_graphs, 'compile': stats.compiled,
        'fast_path': stats.fast_path, 'fallbacks': stats.fallbacks,
        'phase1_ms': round(phase1_ms, 3),
        'global_fps': round(total_frames / ((phase1_ms + stream_ms.sum()) / 1e3), 3),
    }
    if len(stream_ms):
        result.update({
            'ms_p50': round(float(np.percentile(stream_ms, 50)), 3),
            'ms_p90': round(float(np.percentile(stream_ms, 90)), 3),
            'ms_max': round(float(stream_ms.max()), 3),
            'ms_max_at_frame': int(stream_ms.argmax()) + args.scale_frames,
            'ms_mean': round(float(stream_ms.mean()), 3),
        })
        for pct in (10, 50, 90):
            centre = int(len(stream_ms) * pct / 100)
            part = stream_ms[max(0, centre - args.report_window):centre + args.report_window]
            result[f'fps_at_{pct}pct'] = round(1e3 / float(part.mean()), 3)
        tail = stream_ms[-2 * args.report_window:]
        result['fps_last'] = round(1e3 / float(tail.mean()), 3)
        result['ms_first_streaming_window'] = round(
            float(stream_ms[:2 * args.report_window].mean()), 3)
        result['ms_last_window'] = round(float(tail.mean()), 3)
    result['cache'] = None if stats.cache is None else dataclasses.asdict(stats.cache)
    # The engine's page pool, a number in every case (zeros before the first frame).
    result.update(dataclasses.asdict(session.session.engine.pool_stats()))
    result['keyframes'] = stats.keyframes
    result['rollover'] = dataclasses.asdict(session.rollover_stats())
    if device.type == 'cuda':
        # --progress restarts the peak counter per block: the run's peak is the largest.
        peak = max([torch.cuda.max_memory_allocated(device) / 2**30] + peaks)
        result['peak_gpu_memory_gib'] = round(peak, 3)
        result['gpu'] = torch.cuda.get_device_name(device)
    result['torch'] = torch.__version__
    result['python'] = platform.python_version()
    try:
        import flashinfer  # noqa: F401  (version report only)
        result['flashinfer'] = getattr(flashinfer, '__version__', 'unknown')
    except ImportError:
        result['flashinfer'] = None
    return result


def _print_table(result: dict[str, Any]) -> None:
    rows = [(k, v) for k, v in result.items() if k != 'cache']
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f'{key:<{width}}  {value}')
    print(json.dumps(result, sort_keys=True))
