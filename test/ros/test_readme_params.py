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
"""The parameter table (docs/parameters.md) lists exactly the parameters the node declares.

Run: ``python -m pytest test/ros/test_readme_params.py`` (instant).
"""

from __future__ import annotations

from pathlib import Path
import re

from lingbot_map_ros.ros.parameters import params

TABLE = Path(__file__).resolve().parents[2] / 'docs' / 'parameters.md'


def _documented_parameters() -> set[str]:
    text = TABLE.read_text(encoding='utf-8')
    return set(re.findall(r'^\| `([a-z0-9_.]+)` \|', text, flags=re.MULTILINE))


def test_readme_parameter_table_matches_the_declared_parameters():
    declared = {spec.name for spec in params.all_specs()}
    documented = _documented_parameters()
    assert len(declared) > 40
    assert documented == declared, (
        f'missing from docs/parameters.md: {sorted(declared - documented)}; '
        f'not declared: {sorted(documented - declared)}')
