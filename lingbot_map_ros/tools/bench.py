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
"""``lingbot_map_bench``: the engine's benchmarks, one subcommand each.

* ``cache``: one cache-attention layer (ms, TFLOP/s) and the cache's host work per frame, per
  attention backend (``tools/bench_cache.py``);
* ``model``: the whole streaming model, frame by frame (``tools/bench_model.py``);
* ``map``: adding one keyframe to the accumulated map (``tools/bench_map.py``);
* ``loop``: loop closure's model work beside the frames: descriptors, the check's pass
  (``tools/bench_loop.py``);
* ``graph``: loop closure's pose graph on the CPU at 1k and 10k keyframes, the loop closer's
  memory growth (``tools/bench_graph.py``);
* ``memory``: the GPU memory peak of each phase of a session, and its speed
  (``tools/bench_memory.py``);
* ``fidelity``: every combination this device runs, judged by a long fidelity set against the
  official bf16 run's errors (``tools/fidelity.py``); exit status 1 when one fails.

Each subcommand module has ``add_arguments(parser)`` and ``run(args) -> dict``; ``run`` warms
up, synchronizes CUDA around its timings, prints a table and, as its last line, one JSON document.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from lingbot_map_ros.ros.parameters.cli_help import plain
from lingbot_map_ros.tools.cli_errors import USAGE_ERRORS

SUBCOMMANDS = {
    'cache': 'lingbot_map_ros.tools.bench_cache',
    'model': 'lingbot_map_ros.tools.bench_model',
    'map': 'lingbot_map_ros.tools.bench_map',
    'loop': 'lingbot_map_ros.tools.bench_loop',
    'graph': 'lingbot_map_ros.tools.bench_graph',
    'memory': 'lingbot_map_ros.tools.bench_memory',
    'fidelity': 'lingbot_map_ros.tools.fidelity',
}


def build_parser() -> argparse.ArgumentParser:
    """Build the ``lingbot_map_bench`` parser, one subparser per available benchmark."""
    parser = argparse.ArgumentParser(prog='lingbot_map_bench', description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest='command', required=True)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        summary = plain(module.__doc__ or name).strip().splitlines()[0]
        sub = subparsers.add_parser(name, help=summary, description=plain(module.__doc__ or ''),
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark named on the command line; returns the exit status."""
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args)
    except USAGE_ERRORS as exc:
        # A configuration this machine cannot run (no GPU, a missing package or file): one line.
        print(f'lingbot_map_bench {args.command}: {exc}', file=sys.stderr)
        return 1
    return 1 if isinstance(result, dict) and result.get('pass') is False else 0


if __name__ == '__main__':
    raise SystemExit(main())
