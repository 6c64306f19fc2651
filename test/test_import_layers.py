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
"""The package's import graph: no circle, no import from a higher layer, no private name shared.

Every module of ``lingbot_map_ros`` is parsed with :mod:`ast` (nothing is imported, so the test
needs neither torch nor rclpy). Every ``import`` statement counts wherever it stands: at module
level, inside a function (a deferred import is still a dependency, only a later one), and under
``if TYPE_CHECKING:``. Type-only imports count too: a module that needs another's types to be
read depends on it, and moving an import under ``TYPE_CHECKING`` must not be a way to hide a
circle or an upward import. ``importlib.import_module`` with a computed name is not seen.

``from a import b`` is an edge to the module ``a.b`` when ``b`` is a module, else to ``a`` (for a
package, its ``__init__``). A private name is ``_name`` (not a dunder): it is neither imported
from another module of the package nor read as ``module._name`` through an imported module.

The layers, low to high: the top-level modules (``config``, ...), ``engine``, ``ros/messages``,
``ros/parameters``, the rest of ``ros``, ``tools``; each imports only its own layer and those
below, and the top-level modules, ``engine`` and ``ros/messages`` never import ROS: rclpy,
message, launch or tf packages.

Folders are checked as well: no circle among the package's folders (a layer's top-level module,
``engine/engine.py`` say, counts as a folder of its own).

Run: ``pytest -q test/test_import_layers.py`` (a second). ``python test/test_import_layers.py``
prints the graph's circles and violations without asserting.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
import re
import sys

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = 'lingbot_map_ros'

ROS_TOP_LEVEL = frozenset({
    'rclpy', 'rcl_interfaces', 'launch', 'launch_ros', 'ament_index_python', 'tf2_ros',
    'cv_bridge', 'message_filters', 'rosbag2_py', 'rosidl_runtime_py', 'builtin_interfaces',
    'image_transport', 'rosgraph_msgs'})
"""Top-level names of ROS packages; ``*_msgs``, ``*_srvs``, ``*_interfaces`` also count."""

ROS_SUFFIX = re.compile(r'_(msgs|srvs|interfaces)$')


@dataclass(frozen=True)
class Import:
    """One imported module (or name from it) as written in one module."""

    source: str
    """The importing module (dotted)."""
    target: str
    """The imported module (dotted; outside the package, as written)."""
    name: str | None
    """The name taken from ``target`` by ``from target import name`` (None for a module)."""
    line: int
    type_only: bool
    """The import stands under ``if TYPE_CHECKING:``."""

    def where(self) -> str:
        kind = ' (TYPE_CHECKING)' if self.type_only else ''
        return f'{self.source}:{self.line}{kind}'


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package's name for its ``__init__``)."""
    modules = {}
    for path in sorted((ROOT / PACKAGE).rglob('*.py')):
        parts = path.relative_to(ROOT).with_suffix('').parts
        if parts[-1] == '__init__':
            parts = parts[:-1]
        modules['.'.join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or (
        isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING')


def _imports_in(node: ast.AST, type_only: bool):
    """Yield (statement, type_only) for every import under ``node``, in functions too."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, type_only
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _imports_in(ast.Module(body=[stmt], type_ignores=[]), True)
            for stmt in child.orelse:
                yield from _imports_in(ast.Module(body=[stmt], type_ignores=[]), type_only)
        else:
            yield from _imports_in(child, type_only)


def _base_of(module: str, path: Path, stmt: ast.ImportFrom) -> str:
    if not stmt.level:
        return stmt.module or ''
    package = module.split('.')
    if path.name != '__init__.py':
        package = package[:-1]
    package = package[:len(package) - (stmt.level - 1)]
    return '.'.join(package + ([stmt.module] if stmt.module else []))


def parse_imports(modules: dict[str, Path]) -> list[Import]:
    """Every import statement of every module, resolved to the module it loads."""
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
        for stmt, type_only in _imports_in(tree, False):
            if isinstance(stmt, ast.Import):
                found += [Import(module, alias.name, None, stmt.lineno, type_only)
                          for alias in stmt.names]
                continue
            base = _base_of(module, path, stmt)
            for alias in stmt.names:
                submodule = f'{base}.{alias.name}'
                if submodule in modules:
                    found.append(Import(module, submodule, None, stmt.lineno, type_only))
                else:
                    found.append(Import(module, base, alias.name, stmt.lineno, type_only))
    return found


def internal_graph(imports: list[Import], modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for imp in imports:
        if imp.target in modules and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def folder_graph(imports: list[Import], modules: dict[str, Path]) -> dict[str, set[str]]:
    """Return the import graph of the package's folders (a layer's top-level module is its own)."""

    def node(module: str) -> str:
        path = modules[module].relative_to(ROOT / PACKAGE)
        if path.name == '__init__.py' or len(path.parts) > 2:
            return '/'.join(path.parent.parts) or PACKAGE
        return module.removeprefix(PACKAGE + '.')

    graph: dict[str, set[str]] = {node(module): set() for module in modules}
    for imp in imports:
        if imp.target in modules and node(imp.source) != node(imp.target):
            graph[node(imp.source)].add(node(imp.target))
    return graph


def _layer(module: str) -> str:
    parts = module.split('.')
    if len(parts) < 2 or parts[1] not in ('engine', 'ros', 'tools'):
        return 'base'
    if parts[1] == 'ros' and len(parts) > 2 and parts[2] in ('messages', 'parameters'):
        return f'ros.{parts[2]}'
    return parts[1]


def _is_ros(target: str) -> bool:
    top = target.split('.')[0]
    return top in ROS_TOP_LEVEL or bool(ROS_SUFFIX.search(top))


FORBIDDEN = {
    'base': ('engine', 'ros.messages', 'ros.parameters', 'ros', 'tools'),
    'engine': ('ros.messages', 'ros.parameters', 'ros', 'tools'),
    'ros.messages': ('ros.parameters', 'ros', 'tools'),
    'ros.parameters': ('ros', 'tools'),
    'ros': ('tools',),
    'tools': (),
}
"""For each layer, the package's layers it must not import. In ``ros``, ``messages`` (pure
conversions, the tools use them) and ``parameters`` (the tables, the tools read them) sit below
the node's other groups (``nodes``, ``inference``, ``publishers``: the layer ``ros`` here)."""
NO_ROS = ('base', 'engine', 'ros.messages')
"""Layers that import no ROS package at all."""


def layer_violations(imports: list[Import], modules: dict[str, Path]) -> list[str]:
    problems = []
    for imp in imports:
        layer = _layer(imp.source)
        if imp.target in modules:
            target_layer = _layer(imp.target)
            if target_layer in FORBIDDEN[layer]:
                problems.append(f'{imp.where()}: {layer} imports {imp.target} ({target_layer})')
        elif layer in NO_ROS and _is_ros(imp.target):
            problems.append(f'{imp.where()}: {layer} imports the ROS package {imp.target}')
    return sorted(problems)


def _is_private(name: str) -> bool:
    return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


def private_imports(imports: list[Import], modules: dict[str, Path]) -> list[str]:
    return sorted(
        f'{imp.where()}: imports {imp.name} from {imp.target}' for imp in imports
        if imp.target in modules and imp.name is not None and _is_private(imp.name))


def private_attributes(modules: dict[str, Path]) -> list[str]:
    """``module._name`` read through a package module bound by an import (``from a import b``)."""
    problems = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
        bound = {}
        for stmt, _ in _imports_in(tree, False):
            if isinstance(stmt, ast.Import):
                bound.update((alias.asname, alias.name) for alias in stmt.names
                             if alias.asname and alias.name in modules)
                continue
            base = _base_of(module, path, stmt)
            bound.update((alias.asname or alias.name, f'{base}.{alias.name}')
                         for alias in stmt.names if f'{base}.{alias.name}' in modules)
        problems += [
            f'{module}:{node.lineno}: reads {node.attr} of {bound[node.value.id]}'
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in bound and _is_private(node.attr)]
    return sorted(problems)


@pytest.fixture(scope='module')
def package():
    modules = module_files()
    return modules, parse_imports(modules)


def test_the_parser_sees_every_kind_of_import(package):
    """Function-level, TYPE_CHECKING, relative and package imports are all found."""
    modules, imports = package
    assert len(modules) > 100
    by_source = {}
    for imp in imports:
        by_source.setdefault(imp.source, []).append(imp)
    layers = {imp.target for imp in by_source[f'{PACKAGE}.engine.model.layers']}
    assert f'{PACKAGE}.engine.model.layers.block' in layers  # relative: from .block import
    assert any(imp.type_only for imp in imports)
    entry = {imp.target for imp in by_source[f'{PACKAGE}.ros.nodes.entry']}
    assert f'{PACKAGE}.ros.nodes.node_process' in entry  # imported inside run()


def test_no_import_circle(package):
    modules, imports = package
    found = circles(internal_graph(imports, modules))
    assert not found, 'import circles (each line: the modules of one circle):\n' + '\n'.join(
        ' <-> '.join(m.removeprefix(PACKAGE + '.') for m in circle) for circle in found)


def test_no_circle_among_folders(package):
    found = circles(folder_graph(*reversed(package)))
    assert not found, 'circles among folders:\n' + '\n'.join(
        ' <-> '.join(circle) for circle in found)


def test_no_import_from_a_higher_layer(package):
    problems = layer_violations(*reversed(package))
    assert not problems, 'imports against the layers:\n' + '\n'.join(problems)


def test_no_private_name_imported(package):
    problems = private_imports(*reversed(package)) + private_attributes(package[0])
    assert not problems, 'private names imported from another module:\n' + '\n'.join(problems)


def test_the_checks_can_fail(tmp_path):
    """A made-up graph with a circle, an upward import and private names is caught."""
    modules = {f'{PACKAGE}.engine.a': Path('a'), f'{PACKAGE}.engine.b': Path('b'),
               f'{PACKAGE}.ros.c': Path('c'), f'{PACKAGE}.tools.d': Path('d'),
               f'{PACKAGE}.ros.parameters.e': Path('e')}
    imports = [
        Import(f'{PACKAGE}.engine.a', f'{PACKAGE}.engine.b', None, 1, False),
        Import(f'{PACKAGE}.engine.b', f'{PACKAGE}.engine.a', '_Hidden', 2, True),
        Import(f'{PACKAGE}.engine.b', 'sensor_msgs.msg', 'Image', 3, False),
        Import(f'{PACKAGE}.ros.c', f'{PACKAGE}.tools.d', None, 4, False),
        Import(f'{PACKAGE}.ros.parameters.e', f'{PACKAGE}.ros.c', None, 5, False),
    ]
    assert circles(internal_graph(imports, modules)) == [
        [f'{PACKAGE}.engine.a', f'{PACKAGE}.engine.b']]
    assert [line.split(': ', 1)[1] for line in layer_violations(imports, modules)] == [
        'engine imports the ROS package sensor_msgs.msg',
        f'ros imports {PACKAGE}.tools.d (tools)',
        f'ros.parameters imports {PACKAGE}.ros.c (ros)']
    assert private_imports(imports, modules) == [
        f'{PACKAGE}.engine.b:2 (TYPE_CHECKING): imports _Hidden from {PACKAGE}.engine.a']
    (tmp_path / 'a.py').write_text('_hidden = 1\n')
    (tmp_path / 'b.py').write_text(f'def f():\n    from {PACKAGE}.engine import a\n'
                                   '    return a._hidden + a.__name__\n')
    files = {f'{PACKAGE}.engine.a': tmp_path / 'a.py', f'{PACKAGE}.engine.b': tmp_path / 'b.py'}
    assert private_attributes(files) == [
        f'{PACKAGE}.engine.b:3: reads _hidden of {PACKAGE}.engine.a']


def test_the_folder_check_can_fail():
    """Two folders importing each other through different modules make a folder circle."""
    base = ROOT / PACKAGE / 'engine'
    modules = {f'{PACKAGE}.engine.x.a': base / 'x' / 'a.py',
               f'{PACKAGE}.engine.y.b': base / 'y' / 'b.py',
               f'{PACKAGE}.engine.y.c': base / 'y' / 'c.py',
               f'{PACKAGE}.engine.d': base / 'd.py'}
    imports = [Import(f'{PACKAGE}.engine.x.a', f'{PACKAGE}.engine.y.b', None, 1, False),
               Import(f'{PACKAGE}.engine.y.c', f'{PACKAGE}.engine.x.a', None, 1, False),
               Import(f'{PACKAGE}.engine.d', f'{PACKAGE}.engine.x.a', None, 1, False)]
    assert circles(internal_graph(imports, modules)) == []
    assert circles(folder_graph(imports, modules)) == [['engine/x', 'engine/y']]


if __name__ == '__main__':
    MODULES = module_files()
    IMPORTS = parse_imports(MODULES)
    for CIRCLE in circles(internal_graph(IMPORTS, MODULES)):
        print('circle:', ' <-> '.join(m.removeprefix(PACKAGE + '.') for m in CIRCLE))
    for CIRCLE in circles(folder_graph(IMPORTS, MODULES)):
        print('folder circle:', ' <-> '.join(CIRCLE))
    print(*layer_violations(IMPORTS, MODULES), sep='\n')
    print(*private_imports(IMPORTS, MODULES), sep='\n')
    print(*private_attributes(MODULES), sep='\n')
    sys.exit(0)
