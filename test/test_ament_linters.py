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
"""ROS 2 linters as ``colcon test`` runs them: ament_flake8, ament_pep257, ament_copyright.

Run: ``pytest -m linter test/test_ament_linters.py`` (about 20 s on 2 cores).

ament_flake8 runs from its PyPI wheel with its own default configuration (google import order,
99 columns, flake8-quotes/-builtins/-comprehensions/-docstrings), exactly as on a robot;
ament_pep257 from its wheel with the pep257 convention (see :data:`AMENT_PEP257_IGNORE`).
No ament_copyright wheel exists, so its rule
for Apache-2.0 packages is checked here: every Python file starts with a ``Copyright <year>
<holder>`` line followed by the Apache-2.0 notice (see :data:`NOTICE`). Failures list each file
and line, so new files merged from other branches are easy to fix.
"""

from pathlib import Path
import re

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ['lingbot_map_ros', 'test', 'launch', 'setup.py']
NOTICE = [
    'Licensed under the Apache License, Version 2.0 (the "License");',
    'you may not use this file except in compliance with the License.',
    'You may obtain a copy of the License at',
    '',
    '    http://www.apache.org/licenses/LICENSE-2.0',
    '',
    'Unless required by applicable law or agreed to in writing, software',
    'distributed under the License is distributed on an "AS IS" BASIS,',
    'WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.',
    'See the License for the specific language governing permissions and',
    'limitations under the License.',
]
# ament_pep257's own "ament" convention checks every pydocstyle code but these, which includes
# D213 (summary on the second line) and the numpy section layout (D406/D407/D413): the package
# keeps PEP 257's first-line summary and Google ``Args:``/``Returns:`` sections (style.md), so it
# runs ament_pep257 with the pep257 convention plus the ament ignores.
AMENT_PEP257_IGNORE = ['D100', 'D101', 'D102', 'D103', 'D104', 'D105', 'D106', 'D107', 'D203',
                       'D212', 'D404']
_COPYRIGHT = re.compile(r'^# Copyright (\d{4})(-\d{4})? \S.*$')


def python_files():
    """Every Python file the linters check."""
    for target in TARGETS:
        path = ROOT / target
        yield from ([path] if path.is_file() else sorted(path.rglob('*.py')))


def copyright_problem(text: str) -> str | None:
    """Return why ``text`` lacks the Apache-2.0 copyright header, or None when it has it."""
    lines = text.splitlines()
    if lines and lines[0].startswith('#!'):
        lines = lines[1:]
    if not lines or not _COPYRIGHT.match(lines[0]):
        return "first line is not '# Copyright <year> <holder>'"
    comment = [line[2:] if line.startswith('# ') else line[1:] for line in lines[1:14]]
    if comment[:1] != [''] or comment[1:12] != NOTICE:
        return 'the Apache-2.0 notice does not follow the copyright line'
    return None


@pytest.mark.linter
def test_ament_flake8():
    main = pytest.importorskip('ament_flake8.main')
    rc, errors = main.main_with_errors(argv=[str(ROOT / t) for t in TARGETS])
    assert rc == 0 and not errors, 'ament_flake8 found problems:\n' + '\n'.join(
        f'{e.filename}:{e.line_number}:{e.column_number}: {e.code} {e.text}'
        if hasattr(e, 'filename') else str(e) for e in errors)


@pytest.mark.linter
def test_ament_pep257(capsys):
    main = pytest.importorskip('ament_pep257.main')
    rc = main.main(argv=['--convention', 'pep257', '--add-ignore', *AMENT_PEP257_IGNORE, '--',
                         *[str(ROOT / t) for t in TARGETS]])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    problems = [line for line in out.splitlines()
                if re.search(r'\.py:\d+ ', line) and not line.startswith('checking')]
    assert rc == 0, 'ament_pep257 found problems:\n' + '\n'.join(problems or [out[-3000:]])


@pytest.mark.linter
def test_copyright_headers():
    problems = [f'{path.relative_to(ROOT)}:1: {reason}' for path in python_files()
                if (reason := copyright_problem(path.read_text())) is not None]
    assert not problems, 'missing Apache-2.0 copyright headers (ament_copyright):\n' + \
        '\n'.join(problems)


def test_copyright_check_catches_a_missing_or_altered_notice():
    header = '# Copyright 2026 Someone\n#\n' + ''.join(
        f'# {line}\n' if line else '#\n' for line in NOTICE)
    assert copyright_problem(header + '"""Doc."""\n') is None
    assert copyright_problem('#!/usr/bin/env python3\n' + header) is None
    assert 'first line' in copyright_problem('"""Doc."""\n')
    assert 'notice' in copyright_problem(header.replace('2.0 (the', '3.0 (the'))
    assert 'first line' in copyright_problem(header.replace('2026', 'MMXXVI'))
