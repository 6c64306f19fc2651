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
"""The tools' summary files are strict JSON: non-finite numbers are null."""

import json
import math

from lingbot_map_ros.tools import strict_json
import numpy as np


def _not_json(constant):
    raise ValueError(f'{constant} is not JSON')


def test_non_finite_numbers_become_null_at_any_depth(tmp_path):
    value = {'optimisation_ms': math.nan, 'ape': {'rmse': np.float32('inf'), 'n': np.int64(3)},
             'errors': [1.5, -math.inf, (np.nan, 2.0)], 'array': np.array([1.0, np.nan]),
             'path': tmp_path, 'ok': np.float64(0.25)}
    strict_json.write(tmp_path / 'summary.json', value)
    text = (tmp_path / 'summary.json').read_text()
    assert text.endswith('\n')
    back = json.loads(text, parse_constant=_not_json)
    assert back == {'optimisation_ms': None, 'ape': {'rmse': None, 'n': 3},
                    'errors': [1.5, None, [None, 2.0]], 'array': [1.0, None],
                    'path': str(tmp_path), 'ok': 0.25}


def test_pythons_default_would_have_written_bare_nan():
    # What the summaries were written with before: not JSON.
    assert 'NaN' in json.dumps({'x': math.nan})
    assert 'NaN' not in strict_json.dumps({'x': math.nan})
