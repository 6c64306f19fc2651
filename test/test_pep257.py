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
"""Docstring style as ament_pep257 checks it (pydocstyle, pep257 convention, ament ignores).

Run: ``pytest -m linter test/test_pep257.py`` (a few seconds). Google ``Args:`` / ``Returns:`` /
``Raises:`` sections are accepted: the pep257 convention does not check section layout.
"""

from pathlib import Path
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parents[1]
# ament_pep257's default additional ignores.
AMENT_IGNORE = 'D100,D101,D102,D103,D104,D105,D106,D107,D203,D212,D404'


@pytest.mark.linter
def test_pep257():
    result = subprocess.run(
        [sys.executable, '-m', 'pydocstyle', '--convention=pep257',
         f'--add-ignore={AMENT_IGNORE}', 'lingbot_map_ros', 'test', 'launch', 'setup.py'],
        cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f'pydocstyle found problems:\n{result.stdout}{result.stderr}'
