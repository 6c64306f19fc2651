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
"""Measurements live in docs/performance.md, not in the package's code.

The code says why in durable words and points to the section of ``docs/performance.md`` that
holds the figure, its machine and its run. Two things in any ``.py`` file under
``lingbot_map_ros/`` give a measurement away:

* a path into ``bench/results`` (raw outputs of one round, which later rounds replace);
* a timing or rate figure (``0.8 ms``, ``407 TFLOP/s``, ``42 FPS``) on the same line as the
  benchmark machine's name, or on the line before or after it (a wrapped sentence).

Run: ``pytest -q test/test_no_measurements_in_code.py`` (a second).
``python test/test_no_measurements_in_code.py [PACKAGE_DIR]`` prints what it finds in another
copy of the package.
"""

from __future__ import annotations

from pathlib import Path
import re
import sys

PACKAGE = Path(__file__).resolve().parents[1] / 'lingbot_map_ros'

RESULTS = re.compile(r'bench/results\b')
"""A path into the raw benchmark outputs."""

FIGURE = re.compile(r'\d+(\.\d+)? ?(ms|TFLOP/s|FPS|frames/s)\b')
"""A timing or rate figure."""

MACHINE = 'H200'
"""The benchmark machine, whose name beside a figure makes the figure a measurement."""

NEAR = 1
"""Lines either side of a figure searched for the machine's name."""


def offences_in(text: str) -> list[tuple[int, str]]:
    """Return ``(line number, reason)`` for each measurement in one file's text."""
    lines = text.splitlines()
    found = []
    for index, line in enumerate(lines):
        if RESULTS.search(line):
            found.append((index + 1, 'names bench/results'))
        figure = FIGURE.search(line)
        near = lines[max(0, index - NEAR):index + NEAR + 1]
        if figure and any(MACHINE in other for other in near):
            found.append((index + 1, f'figure {figure.group(0)!r} beside {MACHINE!r}'))
    return found


def offences(package: Path) -> list[str]:
    """Return ``path:line: reason`` for each measurement in the ``.py`` files under ``package``."""
    found = []
    for path in sorted(package.rglob('*.py')):
        for number, reason in offences_in(path.read_text(encoding='utf-8')):
            found.append(f'{path.relative_to(package.parent)}:{number}: {reason}')
    return found


def test_detects_a_results_path():
    assert offences_in('"""See\nbench/results/h200_round9/ for it."""\n') == [
        (2, 'names bench/results')]


def test_detects_a_figure_beside_the_machine_on_its_line_or_across_a_line_break():
    wrapped = ('# the plan costs, on the H200,\n'
               '# ~0.8 ms a call\n'
               '# (two lines from the name)\n'
               '# 407 TFLOP/s there\n')
    assert offences_in(wrapped) == [(2, "figure '0.8 ms' beside 'H200'")]
    assert offences_in('RATE = 1  # 42 FPS on an H200\n') == [
        (1, "figure '42 FPS' beside 'H200'")]


def test_a_figure_without_the_machine_or_far_from_it_is_not_a_measurement():
    text = ('TIMEOUT_MS = 250  # 250 ms\n'
            '\n'
            '# (the H200 machine)\n'
            '\n'
            '# wait 10 ms, 30 FPS\n')
    assert offences_in(text) == []
    assert offences_in("TOPICS = '12msgs'  # H200\n") == []


def test_no_measurement_in_the_package():
    found = offences(PACKAGE)
    assert found == [], ('measurements in code (move the figure to docs/performance.md and '
                         'point to its section):\n' + '\n'.join(found))


if __name__ == '__main__':
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE
    print('\n'.join(offences(root)) or 'none')
