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
"""A kernel table's config as ``cache.kernel`` fields (``bench/kernel_json.py``).

The benchmark-only variants' keys (``fp8``, ``exp_split``: ``bench/triton_fp8.py``) have no
engine knob and are refused by name, never dropped.

Run: ``python -m pytest test/bench/test_kernel_json.py``.
"""

from pathlib import Path
import sys

import pytest

# The bench scripts import each other by name, from their folder (as ``python3 bench/x.py`` does).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'bench'))
from kernel_json import kernel_fields  # noqa: E402,I100


def test_table_names_become_cache_kernel_fields():
    assert kernel_fields('triton', {'block_m': 64, 'splits': 3, 'qk_split': False}) == {
        'triton_block_m': 64, 'triton_splits': 3, 'triton_qk': 'single'}
    assert kernel_fields('fa3', {'parts': 1, 'query_scale': 'head'}) == {
        'fa3_parts': 1, 'fa3_query_scale': 'head'}


@pytest.mark.parametrize('key', ['fp8', 'exp_split'])
def test_variant_keys_are_refused_by_name(key):
    with pytest.raises(ValueError, match=f"'{key}'.*bench/triton_fp8.py"):
        kernel_fields('triton', {'block_m': 64, key: True})


def test_bad_values_are_refused_as_the_engine_would():
    with pytest.raises(ValueError, match='triton_block_m'):
        kernel_fields('triton', {'block_m': 48})
