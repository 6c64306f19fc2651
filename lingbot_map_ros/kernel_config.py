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
"""``KernelConfig`` (the ``cache.kernel.*`` parameters): the cache attention's tuning knobs.

Expert settings: the defaults are the fastest measured (docs/performance.md), and they
change speed only, never which products run (``cache.precision`` decides that; a knob that
would leave the fidelity gate is refused under 'faithful'). The attention backends read them
where they are built (``engine/attention/backend.py``), the batch runner where it is built;
nothing reads them from the environment. Benchmarks set them with ``--kernel JSON``
(:func:`kernel_from_json`). Kept apart from :mod:`lingbot_map_ros.config`, which re-exports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
import json
import typing
from typing import Any, Literal

TritonQk = Literal['auto', 'split', 'single', 'widened']
Fa3QueryScale = Literal['head', 'unit']

INT_BOUNDS: dict[str, tuple[int, int]] = {
    'triton_block_m': (16, 256), 'triton_block_n': (16, 256), 'triton_num_warps': (1, 16),
    'triton_num_stages': (1, 8), 'triton_splits': (1, 1024), 'fa3_parts': (1, 1024),
    'fa3_joint_parts': (1, 1024), 'fa3_joint_tail_rows': (0, 191), 'fa3_tail_splits': (1, 1024),
    'fa3_splits': (0, 1024)}
"""Bounds of the integer fields (the ROS parameters announce them too)."""
_POWERS_OF_TWO = frozenset({'triton_block_m', 'triton_block_n', 'triton_num_warps'})


@dataclass(frozen=True)
class KernelConfig:
    """Tiles, key parts and batch forms of the cache attention kernels (``cache.kernel``)."""

    triton_block_m: int = 128
    """Query rows per tile of our Triton kernel (a power of two, 16..256)."""
    triton_block_n: int = 64
    """Keys per tile of our Triton kernel (a power of two, 16..256)."""
    triton_num_warps: int = 8
    """Warps per tile of our Triton kernel (1, 2, 4, 8 or 16)."""
    triton_num_stages: int = 3
    """Software-pipelining depth of our Triton kernel's key loop (1..8)."""
    triton_splits: int = 2
    """Parts the key run is cut into by our Triton kernel, merged by their sum-exps (>= 1)."""
    triton_qk: TritonQk = 'auto'
    """QK product of our Triton kernel over FP8 keys: 'auto' (as ``cache.precision`` says:
    queries in two e4m3 terms when 'faithful', one when 'fast_approximate'), 'split' (two
    terms), 'single' (one term: 'fast_approximate' only), 'widened' (keys widened, exact
    products, slower)."""
    fa3_parts: int = 4
    """Sequences FA3's varlen call cuts a lone run into (``fa3_parts.py``; 1: one sequence with
    FA3's own ``fa3_splits``)."""
    fa3_joint_parts: int = 4
    """The same for each run when a batch of cameras attends its runs in one call (with
    ``fa3_parts`` > 1)."""
    fa3_joint_tail_rows: int = 64
    """In such a joint call, each run's query rows past FA3's last full 192-row tile go to our
    Triton kernel when there are at most this many (0: never)."""
    fa3_tail_splits: int = 16
    """Key parts of our Triton kernel over those tail rows (>= 1)."""
    fa3_splits: int = 1
    """FA3's KV splits with ``fa3_parts`` 1 (0: its heuristic)."""
    fa3_query_scale: Fa3QueryScale = 'unit'
    """FP8 queries of FA3: 'unit' (a saturating cast) or 'head' (one scale per head, over the
    run's queries, with or without parts)."""
    staged_runs: bool = True
    """A batch of cameras writes and attends every camera's run of a block in one launch where
    the backend can ('fa3' with parts; ``cache/staged_runs.py``); false: camera by camera."""
    lanes: bool = True
    """A batch's per-camera work (cache attentions, camera heads) runs side by side on side
    CUDA streams (``runner/lanes.py``); false: one after the other on one stream."""

    def __post_init__(self) -> None:
        for name, (least, most) in INT_BOUNDS.items():
            _check_int(name, getattr(self, name), least, most, name in _POWERS_OF_TWO)
        for name, kind in (('triton_qk', TritonQk), ('fa3_query_scale', Fa3QueryScale)):
            if getattr(self, name) not in typing.get_args(kind):
                raise ValueError(f'cache.kernel.{name}={getattr(self, name)!r} is not one of '
                                 f"{', '.join(typing.get_args(kind))}")
        for name in ('staged_runs', 'lanes'):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f'cache.kernel.{name}={getattr(self, name)!r} must be true or '
                                 'false')

    def changed(self) -> dict[str, Any]:
        """Return the fields that differ from their defaults (``{}`` at the defaults)."""
        default = KernelConfig()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}

    def summary(self) -> str:
        """Return every field as ``name=value``, comma-separated (stats and diagnostics)."""
        return ','.join(f'{k}={_text(v)}' for k, v in asdict(self).items())


def _check_int(name: str, value: Any, least: int, most: int, power_of_two: bool = False) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most \
            or (power_of_two and value & (value - 1)):
        kind = 'a power of two' if power_of_two else 'an integer'
        raise ValueError(f'cache.kernel.{name}={value!r} must be {kind} in [{least}, {most}]')


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def kernel_from_json(text: str, base: KernelConfig | None = None) -> KernelConfig:
    """Return ``base`` (default: the defaults) with the fields of a JSON object replaced.

    For benchmarks' ``--kernel '{"triton_splits": 1}'``.

    Raises:
        ValueError: not a JSON object, a key that is not a field, or a bad value.
    """
    try:
        values = json.loads(text)
    except ValueError as exc:
        raise ValueError(f'--kernel is not JSON: {text!r}') from exc
    names = [f.name for f in fields(KernelConfig)]
    if not isinstance(values, dict) or not set(values) <= set(names):
        raise ValueError(f'--kernel {text!r} must be a JSON object with keys from '
                         f"{', '.join(names)}")
    return KernelConfig(**{**asdict(base or KernelConfig()), **values})
