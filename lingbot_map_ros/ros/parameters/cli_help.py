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
"""``--help`` text: the node executables' usage, interface and parameters, without starting ROS.

The interface (topics, services, transforms) is the node's own table,
:mod:`~lingbot_map_ros.ros.parameters.interface`, and the parameters are the parameter table, so
the help lists what the node has. :func:`plain` turns a docstring into terminal text (the
Sphinx markup taken out); the tools' ``--help`` uses it too.
"""

from __future__ import annotations

import re

from lingbot_map_ros.ros.parameters import interface
from lingbot_map_ros.ros.parameters import params

_ROLE = re.compile(r':(?:mod|class|func|meth|data|attr|exc|obj):`(~?)([^`]+)`')
_LITERAL = re.compile(r'``([^`]+)``')
_MODULE = re.compile(r':mod:`~?([^`]+)`')


def plain(doc: str | None) -> str:
    """Return ``doc`` with roles (``:mod:`~a.b.c``` -> ``c``) and double backquotes removed.

    A role with ``~`` keeps its last dotted part, as Sphinx shows it; a line break inside a
    role (a long name wrapped) is joined.
    """
    if not doc:
        return ''

    def role(match: re.Match) -> str:
        target = re.sub(r'\s+', '', match.group(2))
        return target.rsplit('.', 1)[-1] if match.group(1) else target

    return _LITERAL.sub(r'\1', _ROLE.sub(role, doc))


_USAGE = """usage: {exe} [--help] [--ros-args -p NAME:=VALUE ... --params-file FILE]

{description}

Start it with the package's launch file (ros2 launch lingbot_map_ros lingbot_map.launch.py) or
directly, e.g.:
  {exe} --ros-args --params-file config/lingbot_map.yaml -p weights:=/path/to/lingbot-map.pt \\
      -r image:=/camera/color/image_raw

{interface}

Parameters (name = default: description; docs/parameters.md has them as a table, and
python -m lingbot_map_ros.ros.parameters.params prints it):
"""


def help_plain(doc: str | None) -> str:
    """Return ``doc`` as :func:`plain` does, a module reference as its file (for users)."""

    def path(match: re.Match) -> str:
        return re.sub(r'\s+', '', match.group(1)).replace('.', '/') + '.py'

    return plain(_MODULE.sub(path, doc or ''))


def wants_help(argv: list[str]) -> bool:
    """Return True when ``-h``/``--help`` comes before any ``--ros-args``."""
    head = argv[:argv.index('--ros-args')] if '--ros-args' in argv else argv
    return '-h' in head or '--help' in head


def help_text(exe: str, description: str) -> str:
    """Return the usage, ``description`` (the module docstring) and the parameter list."""
    lines = [_USAGE.format(exe=exe, description=help_plain(description).strip(),
                           interface='\n'.join(interface.help_lines()))]
    for spec in params.all_specs():
        lines.append(f'  {spec.name} = {spec.default!r}: {plain(spec.description)}')
    return '\n'.join(lines)
