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
"""The combinations ``lingbot_map_bench fidelity`` sweeps: axes, ``--combos`` specs, prechecks.

A combination is ``{key: value}`` over flat parameter keys (``cache.backend``) and the
pseudo-key ``fast_path`` (:data:`FAST_PATHS`: ``stream.fast_path`` and ``stream.compile``
together); keys left out keep the parameter file's values. Adding an axis is one entry in
:func:`default_axes`; ``cache.precision`` is swept over its ``Literal`` values when the field
exists.
"""

from __future__ import annotations

import importlib.util
import itertools
import typing
from typing import Any

from lingbot_map_ros.config import CacheConfig
from lingbot_map_ros.engine.attention.backend import BACKEND_NAMES
from lingbot_map_ros.tools.config_files import parse_set
import torch

FAST_PATHS = {
    'eager': {'stream.fast_path': 'eager', 'stream.compile': False},
    'segments': {'stream.fast_path': 'segments', 'stream.compile': False},
    'segments+compile': {'stream.fast_path': 'segments', 'stream.compile': True},
    'whole_frame': {'stream.fast_path': 'whole_frame', 'stream.compile': False},
    'whole_frame+compile': {'stream.fast_path': 'whole_frame', 'stream.compile': True},
}
"""The ``fast_path`` axis: each value sets ``stream.fast_path`` and ``stream.compile``."""

_CUDA_ONLY = ('flashinfer', 'triton', 'fa3')
_PACKAGES = {'flashinfer': 'flashinfer', 'triton': 'triton', 'fa3': 'fa3_fwd_interface'}
"""The module each optional backend imports."""


def _literal_values(section: type, name: str) -> list[str]:
    """Return the values of a ``Literal`` config field, or [] where there is no such field."""
    hints = typing.get_type_hints(section)
    return list(typing.get_args(hints[name])) if name in hints else []


def default_axes(base: dict[str, Any]) -> dict[str, list[Any]]:
    """Return the sweep's axes for the flat base configuration ``base``.

    Adding an axis is one entry here: its key is a flat config key (or ``fast_path``). The
    first axis varies slowest and each axis lists the file's own value first, so the first
    combinations are every backend and K/V dtype at the file's other settings.
    """
    cuda = str(base.get('stream.device', 'cuda')).startswith('cuda')
    axes: dict[str, list[Any]] = {
        'fast_path': ['whole_frame+compile', 'whole_frame'] if cuda else ['eager'],
    }
    if cuda and base.get('stream.dtype', 'bfloat16') == 'bfloat16':
        axes['stream.camera_head_dtype'] = ['bfloat16', 'float32']
    precision = _literal_values(CacheConfig, 'precision')
    if precision:
        axes['cache.precision'] = precision
    axes['cache.backend'] = [b for b in BACKEND_NAMES if b != 'auto']
    axes['cache.dtype'] = ['float8_e4m3fn', 'bfloat16']
    own = {'fast_path': f"{base.get('stream.fast_path')}"
                        f"{'+compile' if base.get('stream.compile') else ''}"}
    for key, values in axes.items():
        first = own.get(key, base.get(key))
        if first in values:
            values.insert(0, values.pop(values.index(first)))
    return axes


def _parse_value(text: str) -> Any:
    return parse_set([f'v={text}'])['v']


def parse_axes(items: list[str], axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Apply ``--axis KEY=V1,V2`` items to ``axes`` (a new axis may be added).

    Raises:
        ValueError: an item without ``=`` or without values.
    """
    axes = dict(axes)
    for item in items:
        key, sep, values = item.partition('=')
        if not sep or not values:
            raise ValueError(f"--axis expects KEY=V1,V2, got '{item}'")
        axes[key.strip()] = [_parse_value(v) for v in values.split(',')]
    return axes


def parse_combo(spec: str) -> dict[str, Any]:
    """``'cache.backend=sdpa,cache.dtype=bfloat16'`` -> a combination (``'default'``: {}).

    Raises:
        ValueError: a part without ``=``.
    """
    if spec.strip() == 'default':
        return {}
    return parse_set([part for part in spec.split(',') if part.strip()])


def combinations(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Return every combination of the axes' values, the first axis varying slowest."""
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*axes.values())]


def combo_parameters(combo: dict[str, Any]) -> dict[str, Any]:
    """Return the flat parameters of a combination (``fast_path`` expanded).

    Raises:
        ValueError: an unknown ``fast_path`` value.
    """
    flat = {}
    for key, value in combo.items():
        if key == 'fast_path':
            if value not in FAST_PATHS:
                raise ValueError(f"fast_path '{value}' is not one of {list(FAST_PATHS)}")
            flat.update(FAST_PATHS[value])
        else:
            flat[key] = value
    return flat


def combo_label(combo: dict[str, Any]) -> str:
    """Return a short one-line name of a combination."""
    return ' '.join(f'{k.rpartition(".")[2]}={v}' for k, v in combo.items()) or 'default'


def precheck(flat: dict[str, Any]) -> str | None:
    """Say why a combination cannot run here before anything is built, or None.

    Only what needs no engine: the device, and whether an optional kernel package is
    installed; everything else the engine itself refuses (:func:`run_combo`).
    """
    device = str(flat.get('stream.device', 'cuda'))
    backend = flat.get('cache.backend')
    if backend in _CUDA_ONLY and not device.startswith('cuda'):
        return f"backend '{backend}' needs CUDA (device '{device}')"
    if device.startswith('cuda') and not torch.cuda.is_available():
        return 'no CUDA device here'
    package = _PACKAGES.get(backend)
    if package is not None and importlib.util.find_spec(package) is None:
        return f"backend '{backend}' needs the {package} package, not installed here"
    return None
