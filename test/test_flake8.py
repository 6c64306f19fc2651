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
"""flake8 (ROS 2 style: 99 columns, /.flake8) and single quotes over the package, tests, launch.

Run: ``pytest -m linter test/test_flake8.py`` (a few seconds).
"""

from pathlib import Path
import subprocess
import sys
import tokenize

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ['lingbot_map_ros', 'test', 'launch', 'setup.py']


def python_files():
    for target in TARGETS:
        path = ROOT / target
        yield from ([path] if path.is_file() else sorted(path.rglob('*.py')))


@pytest.mark.linter
def test_flake8():
    result = subprocess.run([sys.executable, '-m', 'flake8', *TARGETS], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, f'flake8 found problems:\n{result.stdout}{result.stderr}'


@pytest.mark.linter
def test_single_quotes():
    """Strings use single quotes unless they contain one (ament_flake8's flake8-quotes rule)."""
    problems = []
    for path in python_files():
        with tokenize.open(path) as f:
            for tok in tokenize.generate_tokens(f.readline):
                if tok.type != tokenize.STRING:
                    continue
                body = tok.string.lstrip('rbfuRBFU')
                if body.startswith('"') and not body.startswith('"""') and "'" not in body:
                    problems.append(f'{path.relative_to(ROOT)}:{tok.start[0]}: {tok.string}')
    assert not problems, 'use single quotes:\n' + '\n'.join(problems)
