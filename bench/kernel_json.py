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
"""A kernel table's config (the kernels' own argument names) as ``cache.kernel`` fields.

The kernel tables (``attention_kernels.py``, ``faithful_sweep.py``, ``fa3_tail.py``) name a
config by the kernel's arguments (``block_m``, ``splits``, ``joint_parts``); the engine takes
it as ``cache.kernel`` fields, through ``bench model --kernel JSON``, ``golden --kernel JSON``
or a fidelity combination (``--combo``: ``cache.kernel.NAME=VALUE,...``). The result is checked
by ``KernelConfig``.

Usage: ``python3 bench/kernel_json.py triton|fa3 JSON_OR_FILE [--combo]``.
"""

import argparse
import json
import os
import sys

from lingbot_map_ros.kernel_config import kernel_from_json

TRITON = {'block_m': 'triton_block_m', 'block_n': 'triton_block_n',
          'num_warps': 'triton_num_warps', 'num_stages': 'triton_num_stages',
          'splits': 'triton_splits'}
FA3 = {'parts': 'fa3_parts', 'joint_parts': 'fa3_joint_parts',
       'joint_tail_rows': 'fa3_joint_tail_rows', 'tail_splits': 'fa3_tail_splits',
       'splits': 'fa3_splits', 'query_scale': 'fa3_query_scale'}


def kernel_fields(kind, config):
    """Return ``config`` (the ``kind`` kernel's argument names) as ``cache.kernel`` fields.

    Raises:
        ValueError: a key the engine's kernel does not take (the table-only variants).
    """
    names = TRITON if kind == 'triton' else FA3
    out = {}
    for key, value in config.items():
        if key in names:
            out[names[key]] = value
        elif kind == 'triton' and key == 'qk_split':
            out['triton_qk'] = 'split' if value else 'single'
        elif kind == 'triton' and key == 'qk_fp8':
            if not value:
                out['triton_qk'] = 'widened'
        else:
            raise ValueError(f'{kind} config key {key!r} is not a cache.kernel knob (fp8 '
                             'and exp_split select the variants of bench/triton_fp8.py, which '
                             'run in the kernel tables only)')
    kernel_from_json(json.dumps(out))  # checked as the engine would
    return out


def main():
    """Print the ``cache.kernel`` JSON (or combination) of a kernel table's config."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('kind', choices=['triton', 'fa3'])
    parser.add_argument('config', help='a JSON object, or a file holding one')
    parser.add_argument('--combo', action='store_true',
                        help='print cache.kernel.NAME=VALUE,... (a fidelity combination)')
    args = parser.parse_args()
    text = args.config
    if os.path.isfile(text):
        with open(text, encoding='utf-8') as f:
            text = f.read()
    try:
        fields = kernel_fields(args.kind, json.loads(text or '{}'))
    except ValueError as exc:
        sys.stderr.write(f'kernel_json: {exc}\n')
        return 1
    if args.combo:
        print(','.join(f'cache.kernel.{k}={json.dumps(v) if isinstance(v, bool) else v}'
                       for k, v in fields.items()))
    else:
        print(json.dumps(fields))
    return 0


if __name__ == '__main__':
    sys.exit(main())
