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
"""``lingbot_map_bench model --cameras N``: N cameras on one engine, synced frames batched.

What it measures and why: a robot with several cameras runs one node, one model and one page
pool (issue 19). Each camera is a stream of its own (a ``RolloverSession`` on the engine);
at every tick each camera has one frame with the same stamp, and the streaming frames of all
cameras run as one batch (``engine/cameras/camera_batch.py``: frame-wise work batched, each
stream's cache attention its own). Scale phases and rollovers run alone, as in the node.

Every tick is timed with CUDA events and a device sync (all cameras' frames of that tick).
Reported: per-camera and aggregate frames/s (global, phase 1 included, and streaming only),
p50/p90 ms per tick, the batch counters, peak GPU memory, the pool's pages and each camera's
cache. ``--cameras 1`` runs the same loop with one camera: the baseline of the batch gain.
The last line printed is one JSON document.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import contextlib
import dataclasses
import json
import time
from typing import Any

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.cameras.camera_batch import BatchStats, run_jobs
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
from lingbot_map_ros.engine.profiling import StepProfiler
from lingbot_map_ros.engine.session.frame_job import FrameJob
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.prediction import FramePrediction
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.tools.bench_timeline import print_timeline, profile_ticks, TICK
import numpy as np
import torch

_TICK_NS = 33_000_000


def step_batch(sessions: Sequence, frames: Sequence[tuple[torch.Tensor, object, int]],
               stats: BatchStats | None = None,
               spans: StepProfiler | None = None) -> list[list[FramePrediction]]:
    """Step preprocessed frames of several sessions, batched where they can.

    ``sessions[k].step_tensor(*frames[k])`` for each k, without a feeder's policy (the node's
    path is ``camera_batch.feed_batch``): the benchmark feeds tensors already on the device,
    so no preprocessing or stamp check is timed. The first error is raised after every other
    frame was run (the benchmark stops on it).

    Args:
        sessions: ``StreamingSession`` or ``RolloverSession``, one per stream.
        frames: per session, ``(tensor, info, tag)`` as ``step_tensor`` takes them.
        stats: as for ``camera_batch.feed_batch``.
        spans: labels the sessions' steps (``bench_timeline.SESSION_STEPS``) when given.
    """
    def span(name: str) -> Any:
        return contextlib.nullcontext() if spans is None else spans.span(name)

    preds: list[list[FramePrediction]] = [[] for _ in sessions]
    planned: list[tuple[int, FrameJob]] = []
    failed: list[Exception] = []
    for k, (session, (tensor, info, tag)) in enumerate(zip(sessions, frames)):
        try:
            with span('plan'):
                job = session.frame_job(tensor, info, tag)
            if job is not None:
                planned.append((k, job))
            elif stats is not None:
                stats.alone_frames += 1  # a scale frame, buffered
        except Exception as exc:  # noqa: BLE001 - the first one is raised below
            failed.append(exc)
    outcomes = run_jobs([job for _, job in planned], stats)
    for (k, job), outcome in zip(planned, outcomes):
        try:
            with span('finish'):
                preds[k] = sessions[k].finish_job(job, outcome)
        except Exception as exc:  # noqa: BLE001 - the first one is raised below
            failed.append(exc)
    if failed:
        raise failed[0]
    return preds


def synthetic_frames(height: int, width: int,
                     device: torch.device) -> tuple[list[torch.Tensor], PreprocessInfo]:
    """Make a pool of 16 distinct [3, H, W] frames on the device (smooth noise in [0, 1])."""
    gen = torch.Generator().manual_seed(1234)
    low = torch.rand(16, 3, height // 14 + 1, width // 14 + 1, generator=gen)
    frames = torch.nn.functional.interpolate(low, size=(height, width), mode='bilinear',
                                             align_corners=False).clamp(0, 1)
    info = PreprocessInfo(original_size_hw=(height, width), resized_size_hw=(height, width),
                          image_size_hw=(height, width), crop_top=0)
    return [f.to(device) for f in frames], info


def run_cameras(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    """Run ``args.cameras`` streams on one engine; print the table and return the JSON dict.

    With ``args.profile`` (N), N more ticks run under the profiler after the timed ones: the
    top operators by device time, and where a tick's time goes (``bench_timeline.py``).

    Raises:
        ValueError: fewer than one camera.
    """
    cameras = args.cameras
    if cameras < 1:
        raise ValueError(f'--cameras {cameras}: give one camera or more')
    config = dataclasses.replace(config, cache=dataclasses.replace(config.cache,
                                                                   streams=cameras))
    engine = Engine.load(config, args.weights, allow_random_weights=args.weights is None,
                         seed=args.seed)
    sessions = [RolloverSession(StreamingSession(config, engine=engine))
                for _ in range(cameras)]
    device = torch.device(args.device)
    frames, info = synthetic_frames(args.height, args.width, device)
    warmup = args.scale_frames + args.window + 10 if args.warmup is None else args.warmup
    _ticks(sessions, frames, info, warmup, device, BatchStats())
    for session in sessions:
        session.reset()
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    stats = BatchStats()
    times_ms, scale_ticks = _ticks(sessions, frames, info, args.frames, device, stats)
    result = _summarise(args, sessions, engine, times_ms, scale_ticks, stats, device)
    for key, value in result.items():
        if key not in ('per_camera', 'cache'):
            print(f'{key:<28}  {value}')
    print(json.dumps(result, sort_keys=True))
    if args.profile:
        summary, table = profile_ticks(lambda spans: _ticks(
            sessions, frames, info, args.profile, device, BatchStats(), spans,
            first=args.frames), engine, device)
        print(table)
        print_timeline(summary)
        result['timeline'] = summary
    return result


def _ticks(sessions: list[RolloverSession], frames: list[torch.Tensor], info: PreprocessInfo,
           count: int, device: torch.device, stats: BatchStats,
           spans: StepProfiler | None = None, first: int = 0) -> tuple[list[float], int]:
    """Feed ``count`` ticks (one frame per camera each); their ms and the scale-phase ticks.

    ``spans`` (the profiler's, when profiling) labels each tick and the sessions' steps;
    ``first``: the first tick's number (stamps go on from an earlier run).
    """
    times_ms: list[float] = []
    scale_ticks = 0
    cuda = device.type == 'cuda'
    for i in range(first, first + count):
        # Each camera sees other frames of the pool (cameras look at different things).
        inputs = [(frames[(i + 5 * k) % len(frames)], info, i * _TICK_NS)
                  for k in range(len(sessions))]
        if cuda:
            torch.cuda.synchronize(device)
        with contextlib.nullcontext() if spans is None else spans.span(TICK):
            start = time.perf_counter()
            preds = step_batch(sessions, inputs, stats, spans)
            if cuda:
                torch.cuda.synchronize(device)
        times_ms.append((time.perf_counter() - start) * 1e3)
        scale_ticks += any(p.role == 'scale' for ps in preds for p in ps) or not preds[0]
    return times_ms, scale_ticks


def _summarise(args: argparse.Namespace, sessions: list[RolloverSession], engine: Engine,
               times_ms: list[float], scale_ticks: int, stats: BatchStats,
               device: torch.device) -> dict[str, Any]:
    cameras = len(sessions)
    total_s = sum(times_ms) / 1e3
    streaming = np.asarray(times_ms[scale_ticks:])
    stream_s = float(streaming.sum()) / 1e3
    per_camera = []
    for k, session in enumerate(sessions):
        cache = session.stats().cache
        per_camera.append({
            'camera': k, 'frames': args.frames,
            'fps': round(args.frames / total_s, 3),
            'keyframes': session.stats().keyframes,
            'rollovers': session.rollover_stats().rollovers,
            'cache': None if cache is None else dataclasses.asdict(cache)})
    result: dict[str, Any] = {
        'mode': 'model-cameras', 'cameras': cameras, 'preset': args.preset,
        'height': args.height, 'width': args.width, 'frames_per_camera': args.frames,
        'scale_frames': args.scale_frames, 'window': args.window,
        'keyframe_interval': args.keyframe_interval, 'backend': args.backend,
        'dtype': args.dtype, 'depth': args.depth, 'fast_path': engine.fast_path.mode.aggregator,
        'compile': engine.fast_path.mode.compiled,
        'fallbacks': engine.fast_path.fallbacks(),
        'aggregate_fps': round(cameras * args.frames / total_s, 3),
        'per_camera_fps': round(args.frames / total_s, 3),
        'aggregate_streaming_fps': round(cameras * len(streaming) / stream_s, 3)
        if len(streaming) else None,
        'tick_ms_p50': round(float(np.percentile(streaming, 50)), 3) if len(streaming) else None,
        'tick_ms_p90': round(float(np.percentile(streaming, 90)), 3) if len(streaming) else None,
        'batches': stats.batches, 'batched_frames': stats.batched_frames,
        'alone_frames': stats.alone_frames,
        'per_camera': per_camera,
    }
    result.update(dataclasses.asdict(engine.pool_stats()))
    if device.type == 'cuda':
        result['peak_gpu_memory_gib'] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
        result['gpu'] = torch.cuda.get_device_name(device)
    result['torch'] = torch.__version__
    return result
