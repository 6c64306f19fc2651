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
"""The tools' JSON files in strict JSON: a non-finite number is written as ``null``.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which is not JSON: ``jq``,
JavaScript and most other readers refuse the whole file. A figure that does not exist (the
optimisation time of a run without a loop, an error on an empty trajectory) is ``null``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np


def finite_or_none(value: Any) -> Any:
    """Return ``value`` with every non-finite float (Python or numpy) replaced by None.

    Dicts, lists and tuples are walked (tuples become lists, as JSON has them); numpy scalars
    and arrays become Python numbers and lists.
    """
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """Return ``value`` as indented strict JSON (other objects as their ``str``)."""
    return json.dumps(finite_or_none(value), indent=2, default=str, allow_nan=False)


def write(path: Path, value: Any) -> None:
    """Write ``value`` to ``path`` as strict JSON, with a final newline."""
    Path(path).write_text(dumps(value) + '\n', encoding='utf-8')
