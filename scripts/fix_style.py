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
"""Mend the two mechanical ament lint rules in place: the copyright header and the import order.

Usage: ``python scripts/fix_style.py [FILE ...]`` (default: every file the linters check).

- Adds the Apache-2.0 header that test/test_ament_linters.py requires to files without one.
- Re-orders a file's leading block of imports into ament_flake8's google order: ``__future__``,
  standard library, everything else (this package sorts among the third-party modules, as
  ament_flake8 has no application-import-names), relative imports; one blank line between
  groups, each sorted by module name ignoring case. A block with comments inside is left alone
  (reported), and names inside one ``from`` import are not re-sorted (fix I101 by hand).

Run the linter tests afterwards: ``pytest -m linter``.
"""

import ast
from pathlib import Path
import sys

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'test'))
from test_ament_linters import copyright_problem, NOTICE, python_files  # noqa: E402, I100

HEADER = '# Copyright 2026 The lingbot_map_ros Authors\n#\n' + ''.join(
    f'# {line}\n' if line else '#\n' for line in NOTICE)
STDLIB = set(sys.stdlib_module_names)


def add_header(text: str) -> str:
    """Return ``text`` with the copyright header (after a shebang line)."""
    if copyright_problem(text) is None:
        return text
    if text.startswith('#!'):
        first, rest = text.split('\n', 1)
        return first + '\n' + HEADER + rest
    return HEADER + text


def _group(node: ast.stmt) -> int:
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return 3
        if node.module == '__future__':
            return 0
        module = node.module
    else:
        module = node.names[0].name
    return 1 if module.split('.')[0] in STDLIB else 2


def _key(node: ast.stmt) -> tuple[int, str]:
    if isinstance(node, ast.ImportFrom):
        return node.level, (node.module or '').lower()
    return 0, node.names[0].name.lower()


def sort_imports(text: str, name: str) -> str:
    """Return ``text`` with its leading import block in ament_flake8's order."""
    lines = text.splitlines(keepends=True)
    body = ast.parse(text).body
    start = 1 if body and isinstance(body[0], ast.Expr) and \
        isinstance(body[0].value, ast.Constant) else 0
    block = []
    for node in body[start:]:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        block.append(node)
    if len(block) < 2:
        return text
    first, last = block[0].lineno - 1, block[-1].end_lineno
    covered = {i for n in block for i in range(n.lineno - 1, n.end_lineno)}
    if any(lines[i].strip() for i in range(first, last) if i not in covered):
        print(f'{name}: comment inside the import block, left alone')
        return text
    groups: dict[int, list[ast.stmt]] = {}
    for node in block:
        groups.setdefault(_group(node), []).append(node)
    out: list[str] = []
    for group in sorted(groups):
        if out:
            out.append('\n')
        for node in sorted(groups[group], key=_key):
            out.extend(lines[node.lineno - 1:node.end_lineno])
    return ''.join(lines[:first] + out + lines[last:])


def main(paths: list[str]) -> int:
    """Fix ``paths`` (default: every linted file); print what changed."""
    for path in [Path(p) for p in paths] or list(python_files()):
        text = path.read_text()
        fixed = sort_imports(add_header(text), str(path))
        if fixed != text:
            path.write_text(fixed)
            print(f'fixed {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
