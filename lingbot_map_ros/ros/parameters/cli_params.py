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
"""``-p NAME:=VALUE`` on the command line: each value's type checked against the parameter's.

A ``-p`` value of the wrong type for a parameter that a ``--params-file`` sets too is dropped by
rcl without a word: ``-p loop.candidates:=3.5`` with config/lingbot_map.yaml starts with the
file's 3. Without a file, rclpy refuses it. Both executables check the command line here
before ``rclpy.init``, so either way the node refuses to start with the parameter's name and
the type it takes, as it does for a YAML value of the wrong type.

A ``--params-file`` none of whose top keys can name this node (``lingbot_map_node:`` for a node
named ``lingbot_map``) is ignored by rcl without a word, and the node then fails on what it
lacks ("weights is empty"); :func:`params_file_problems` names the keys it found and the one the
node reads, for a WARN before that.

The value's type is read as rcl reads it (a YAML scalar): ``true``/``false`` (``yes``, ``on``...)
a bool, digits an integer, a number with a point or an exponent a double, anything else (or
quoted) a string; ``[a, b]`` an array of one element type.
"""

from __future__ import annotations

from pathlib import Path
import re
from typing import Any, Iterator

from lingbot_map_ros.ros.parameters.params import all_specs
import yaml

_BOOL_WORDS = {w for word in ('true', 'false', 'yes', 'no', 'on', 'off')
               for w in (word, word.capitalize(), word.upper())}
_INTEGER = re.compile(r'[+-]?\d+')
_DOUBLE = re.compile(r'[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?'
                     r'|[+-]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)')

_SCALAR_TYPES = {bool: 'bool', int: 'integer', float: 'double', str: 'string'}


def _scalar_type(text: str) -> str:
    text = text.strip()
    if text[:1] in ('"', "'"):
        return 'string'
    if text in _BOOL_WORDS:
        return 'bool'
    if _INTEGER.fullmatch(text):
        return 'integer'
    if _DOUBLE.fullmatch(text):
        return 'double'
    return 'string'


def value_type(text: str) -> str | None:
    """Return the rcl type of a ``-p`` value: ``'integer'``, ``'double array'``...

    None for an empty array (``[]``, typed by nothing) or a mixed one (rcl refuses it itself).
    """
    text = text.strip()
    if text.startswith('[') and text.endswith(']'):
        if not text[1:-1].strip():
            return None
        types = {_scalar_type(item) for item in text[1:-1].split(',')}
        return f'{types.pop()} array' if len(types) == 1 else None
    return _scalar_type(text)


def expected_type(default: Any) -> str:
    """Return the type name of a parameter with this default (as :func:`value_type` names it)."""
    if isinstance(default, (list, tuple)):
        element = next(iter(default), '')
        return f'{_SCALAR_TYPES[type(element)]} array'
    return _SCALAR_TYPES[type(default)]


def overrides(argv: list[str], node_name: str) -> Iterator[tuple[str, str]]:
    """Yield ``(name, value)`` of each ``-p``/``--param`` of ``argv`` that targets ``node_name``.

    Only inside ``--ros-args`` sections (up to ``--``); a rule with a node prefix counts when
    the prefix's last part is the node's name or a wildcard.
    """
    in_ros_args = False
    words = iter(argv)
    for word in words:
        if word == '--ros-args':
            in_ros_args = True
        elif word == '--':
            in_ros_args = False
        elif in_ros_args and word in ('-p', '--param'):
            rule = next(words, '')
            target, sep, value = rule.partition(':=')
            if not sep:
                continue
            prefix, _, name = target.rpartition(':')
            if prefix and prefix.rsplit('/', 1)[-1] not in (node_name, '*', '**'):
                continue
            yield name, value


def type_problem(argv: list[str], node_name: str) -> str | None:
    """Return why a ``-p`` value of ``argv`` has the wrong type for its parameter, or None.

    Names the node does not declare are left to the unknown-name check at start.
    """
    specs = None
    for name, value in overrides(argv, node_name):
        if specs is None:
            specs = {spec.name: spec for spec in all_specs()}
        spec = specs.get(name)
        got = value_type(value)
        if spec is None or got is None:
            continue
        want = expected_type(spec.default)
        if got != want:
            return (f'-p {name}:={value}: {name} takes {_article(want)} {want}, not '
                    f'{_article(got)} {got} (e.g. {name}:={_example(spec.default)})')
    return None


def _article(type_name: str) -> str:
    return 'an' if type_name[0] in 'aeiou' else 'a'


def _example(default: Any) -> str:
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, (list, tuple)):
        return '[' + ', '.join(str(v) for v in default) + ']'
    return str(default) if default != '' else "'text'"


def params_files(argv: list[str]) -> list[str]:
    """Return the ``--params-file`` arguments inside ``--ros-args`` sections of ``argv``."""
    files, in_ros_args, words = [], False, iter(argv)
    for word in words:
        if word == '--ros-args':
            in_ros_args = True
        elif word == '--':
            in_ros_args = False
        elif in_ros_args and word == '--params-file':
            files.append(next(words, ''))
    return files


def _node_name(argv: list[str], default: str) -> str:
    """Return the node's name after a ``-r __node:=NAME`` (or ``__name``) remap, if any."""
    name, words = default, iter(argv)
    for word in words:
        if word in ('-r', '--remap'):
            target, _, value = next(words, '').partition(':=')
            if target in ('__node', '__name') and value:
                name = value
    return name


def params_file_problems(argv: list[str], node_name: str) -> list[str]:
    """Return, per ``--params-file`` with no section for the node, why it is ignored.

    A key names the node when its last part is the node's name or a wildcard (``/**``,
    ``/*/lingbot_map``); namespaces are not judged (rcl does, more strictly). A file that
    cannot be read or parsed is left to rcl, which refuses it with its own message.
    """
    name = _node_name(argv, node_name)
    problems = []
    for path in params_files(argv):
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding='utf-8'))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if not isinstance(doc, dict) or not doc:
            continue
        keys = [str(key) for key in doc]
        if any(key.rstrip('/').rsplit('/', 1)[-1] in (name, '*', '**') for key in keys):
            continue
        shown = ', '.join(f"'{key}'" for key in keys[:5]) + (', ...' if len(keys) > 5 else '')
        problems.append(f'--params-file {path}: no section for this node, so rcl ignores the '
                        f"file: its top keys are {shown}; the node '{name}' reads '{name}:' "
                        "(or '/**:' for every node), with 'ros__parameters:' under it")
    return problems
