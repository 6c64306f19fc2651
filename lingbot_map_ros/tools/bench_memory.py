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
"""``lingbot_map_bench memory``: the GPU memory peak of every phase of a session, and its speed.

What it measures and why: a robot GPU has 8-16 GB, and the session's peak decides whether the
node fits, not its steady state. This runs a parameter file's configuration (default
``config/lingbot_map.yaml``; ``--set KEY=VALUE`` changes any engine key) as the node would,
through the rollover layer, on synthetic frames already on the device, and after each phase
records ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` (the caching
allocator's segments: what the card must really have) since the previous phase, then resets
the peak counters:

* ``weights``: building the model and loading the weights (random golden-formula weights
  unless ``--weights``);
* ``warm-up/capture``: the first frame, which builds the fast path for its size (a scale pass
  on copies of it, ``torch.compile``, the CUDA-graph captures, the full-window graphs);
* ``phase 1``: the other scale frames and the scale pass over all N_s of them;
* ``streaming``: the window filling, then ``--steady`` frames (their per-frame latency, CUDA
  events around each call as ``bench model`` times it, gives ``ms_p50``);
* ``rollover``: the frame that rolls the session over (``stream.session_keyframes`` is set so
  that it comes right after the steady frames) and one more.

Also: the KV cache's bytes, each model part's weight bytes, the peak over all phases. On the
CPU the run works (a short one with ``--config demo_tiny_cpu.yaml``) and the memory fields
are null. The last line printed is one JSON document.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
import time
from typing import Any

from lingbot_map_ros.config import engine_config_from_yaml, EngineConfig, load_yaml
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.engine.session.rollover import RolloverSession
from lingbot_map_ros.ros.parameters import params
from lingbot_map_ros.tools.bench_cameras import synthetic_frames
from lingbot_map_ros.tools.bench_model import stream_frames
from lingbot_map_ros.tools.cli_errors import check_device
from lingbot_map_ros.tools.config_files import find_config, parse_set
import numpy as np
import torch

GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags of the ``memory`` subcommand to ``parser``."""
    parser.add_argument('--config', default='lingbot_map.yaml',
                        help="parameter file: a path, or a name in the package's config/ "
                             '(lingbot_map.yaml, small_gpu.yaml, demo_tiny_cpu.yaml)')
    parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                        help='override an engine key of the file, e.g. cache.dtype=float8_e4m3fn '
                             '(repeatable; an unknown key is refused with the nearest names)')
    parser.add_argument('--depth', action=argparse.BooleanOptionalAction, default=None,
                        help='run the depth head (stream.enable_depth; default: the file)')
    parser.add_argument('--height', type=int, default=378, help='processed image height (px)')
    parser.add_argument('--width', type=int, default=504, help='processed image width (px)')
    parser.add_argument('--steady', type=int, default=30,
                        help='streaming frames timed after the window has filled')
    parser.add_argument('--scale-head-chunk', type=int, default=None, metavar='N',
                        help='frames the depth head takes at once in phase 1 (its '
                             'frames_chunk_size; default 1)')
    parser.add_argument('--weights', default=None,
                        help='checkpoint to load instead of random weights (same memory)')
    parser.add_argument('--seed', type=int, default=0, help='random-weights salt')


def build_config(args: argparse.Namespace) -> EngineConfig:
    """Return the file's engine config with ``--set``, ``--depth`` and the run's session length.

    The session is cut right after the steady frames, so that the run includes a rollover.
    """
    path = Path(args.config)
    overrides = parse_set(args.set)
    if args.depth is not None:
        overrides['stream.enable_depth'] = args.depth
    path = path if path.is_file() else find_config(args.config)
    params.check_names(load_yaml(path))
    params.check_names(overrides)
    config = engine_config_from_yaml(path, **overrides)
    check_device(config.stream.device, 'stream.device',
                 'for the CPU dry run: lingbot_map_bench memory --config demo_tiny_cpu.yaml '
                 '--steady 2')
    cache = config.cache
    session_keyframes = cache.scale_frames + cache.sliding_window + args.steady
    stream = dataclasses.replace(config.stream, session_keyframes=session_keyframes,
                                 image_width=args.width)
    return dataclasses.replace(config, stream=stream)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the phases described in the module docstring; print them and return the JSON dict."""
    if args.steady < 1:
        raise ValueError(f'--steady={args.steady} must be >= 1')
    config = build_config(args)
    device = torch.device(config.stream.device)
    cuda = device.type == 'cuda'
    phases: list[dict[str, Any]] = []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    session = RolloverSession(StreamingSession(config, args.weights,
                                               allow_random_weights=args.weights is None,
                                               seed=args.seed))
    if args.scale_head_chunk is not None and session.model.depth_head is not None:
        session.model.depth_head.frames_chunk_size = args.scale_head_chunk
    _mark(phases, 'weights', device, began)
    frames, info = synthetic_frames(args.height, args.width, device)
    cache = config.cache
    steps = [('warm-up/capture', 1), ('phase 1', cache.scale_frames - 1),
             ('streaming', cache.sliding_window + args.steady), ('rollover', 2)]
    phased = _Phased(session, steps, lambda name, start: _mark(phases, name, device, start))
    times_ms, _ = stream_frames(phased, frames, info, sum(n for _, n in steps), device)
    # Only the call that runs the scale pass and the streaming calls return predictions.
    streaming = cache.sliding_window + args.steady
    times = {'phase 1': times_ms[:1], 'streaming': times_ms[1:1 + streaming],
             'rollover': times_ms[1 + streaming:]}
    return _report(args, config, session, phases, times)


class _Phased:
    """The session, calling ``mark(phase, start)`` after the last frame of each phase."""

    def __init__(self, session: RolloverSession, steps: list[tuple[str, int]], mark: Any) -> None:
        self._session, self._mark = session, mark
        self._ends, at = {}, 0
        for name, count in steps:
            at += count
            self._ends[at] = name
        self._fed = 0
        self._start = time.perf_counter()

    def step_tensor(self, *args: Any, **kwargs: Any) -> list[Any]:
        preds = self._session.step_tensor(*args, **kwargs)
        self._fed += 1
        if self._fed in self._ends:
            self._mark(self._ends[self._fed], self._start)
            self._start = time.perf_counter()
        return preds


def _mark(phases: list[dict[str, Any]], name: str, device: torch.device, start: float) -> None:
    """Record the phase's peaks (CUDA) and wall time, print a line, restart the counters."""
    cuda = device.type == 'cuda'
    if cuda:
        torch.cuda.synchronize(device)
    row: dict[str, Any] = {'phase': name, 'seconds': round(time.perf_counter() - start, 3)}
    for key, fn in (('allocated_gib', torch.cuda.memory_allocated),
                    ('max_allocated_gib', torch.cuda.max_memory_allocated),
                    ('reserved_gib', torch.cuda.memory_reserved),
                    ('max_reserved_gib', torch.cuda.max_memory_reserved)):
        row[key] = round(fn(device) / GIB, 3) if cuda else None
    phases.append(row)
    print(f"{name:16s} {row['seconds']:8.2f} s  allocated {_gib(row['allocated_gib'])}  "
          f"max allocated {_gib(row['max_allocated_gib'])}  reserved "
          f"{_gib(row['reserved_gib'])}  max reserved {_gib(row['max_reserved_gib'])}",
          flush=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)


def _gib(value: float | None) -> str:
    return '   n/a' if value is None else f'{value:6.3f}'


def _report(args: argparse.Namespace, config: EngineConfig, session: RolloverSession,
            phases: list[dict[str, Any]], times: dict[str, list[float]]) -> dict[str, Any]:
    model = session.model
    stats = session.stats()
    steady = times['streaming'][-args.steady:]
    rollover = session.rollover_stats()
    cuda = phases[0]['max_allocated_gib'] is not None
    result: dict[str, Any] = {
        'mode': 'memory', 'config': args.config, 'set': args.set,
        'height': args.height, 'width': args.width, 'depth': config.stream.enable_depth,
        'scale_frames': config.cache.scale_frames, 'window': config.cache.sliding_window,
        'max_total_frames': config.cache.max_total_frames, 'kv_dtype': config.cache.dtype,
        'backend': config.cache.backend, 'fast_path': stats.fast_path,
        'compile': stats.compiled,
        'scale_head_chunk': None if model.depth_head is None
        else model.depth_head.frames_chunk_size,
        'phases': phases,
        'peak_allocated_gib': max(p['max_allocated_gib'] for p in phases) if cuda else None,
        'peak_reserved_gib': max(p['max_reserved_gib'] for p in phases) if cuda else None,
        'peak_phase': max(phases, key=lambda p: p['max_reserved_gib'])['phase']
        if cuda else None,
        'phase1_ms': round(times['phase 1'][-1], 3),
        'ms_p50': round(float(np.percentile(steady, 50)), 3),
        'ms_mean': round(float(np.mean(steady)), 3),
        'rollovers': rollover.rollovers,
        'rollover_ms': None if not rollover.rollovers else round(rollover.max_rollover_ms, 3),
        'kv_gib': None if stats.cache is None else round(stats.cache.kv_bytes / GIB, 3),
        'weights_gib': {name: round(sum(p.numel() * p.element_size()
                                        for p in part.parameters()) / GIB, 3)
                        for name, part in model.named_children()},
        'torch': torch.__version__,
        'gpu': torch.cuda.get_device_name() if cuda else None,
    }
    print(f"peak: {_gib(result['peak_allocated_gib'])} GiB allocated, "
          f"{_gib(result['peak_reserved_gib'])} GiB reserved ({result['peak_phase']}); "
          f"streaming p50 {result['ms_p50']:.2f} ms, phase 1 {result['phase1_ms']:.1f} ms, "
          f"rollover {result['rollover_ms']} ms; KV {result['kv_gib']} GiB")
    print(json.dumps(result, sort_keys=True))
    return result
