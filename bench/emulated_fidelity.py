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
r"""The long-sequence gate over an emulated 8-bit attention design (issue #44, Must have 1).

``lingbot_map_bench fidelity`` runs its combinations through the engine as the node builds it;
this script builds every KV pool's attention as ``bench/quant_emulation.py``'s
``EmulatedBackend`` for one recipe instead (the pool is asked for ``sdpa`` with bf16 K/V, so
the emulation quantises the cache's bf16 keys and values as a kernel would on write), and
runs the tool's sweep unchanged. The emulation is no engine choice: it exists here only.

Run from the repository root, e.g. on the GPU machine::

    python3 bench/emulated_fidelity.py a --set .gpu_data/long/stream_D \\
        --frames-dir .gpu_data/loop --json-out $OUT/emulated_a.json

The first argument names a recipe of ``quant_emulation.RECIPES`` ('a'..'d'); the rest are the
``fidelity`` tool's flags. Without ``--combos`` it runs the one combination the emulation
needs (``cache.backend=sdpa,cache.dtype=bfloat16``, eager). The JSON gets the recipe added.
"""

import argparse
import dataclasses
import json
from pathlib import Path
import sys

from quant_emulation import EmulatedBackend, RECIPES

COMBO = 'cache.backend=sdpa,cache.dtype=bfloat16,fast_path=eager'


def main(argv: list[str]) -> int:
    """Run the gate with every pool's attention emulating ``argv[0]``'s recipe."""
    if not argv or argv[0] not in RECIPES:
        print(f'usage: emulated_fidelity.py {{{",".join(RECIPES)}}} FIDELITY_FLAGS...',
              file=sys.stderr)
        return 2
    recipe = RECIPES[argv[0]]
    from lingbot_map_ros.engine.cache import kv_pool
    from lingbot_map_ros.tools import fidelity

    def make_backend(name: str, **kwargs: object) -> EmulatedBackend:
        return EmulatedBackend(recipe)

    kv_pool.make_backend = make_backend  # every pool built from here on emulates the recipe
    parser = argparse.ArgumentParser(prog='emulated_fidelity.py')
    fidelity.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    if not args.combos:
        args.combos = [COMBO]
    summary = fidelity.run(args)
    if args.json_out and Path(args.json_out).exists():
        doc = json.loads(Path(args.json_out).read_text())
        doc['emulation'] = {'recipe': argv[0], **dataclasses.asdict(recipe)}
        Path(args.json_out).write_text(json.dumps(doc, indent=1) + '\n')
    print(json.dumps({'emulation': argv[0], 'pass': summary.get('pass')}))
    return 0 if summary.get('pass') else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
