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
"""``--help`` of the node executables: usage and every parameter, without starting ROS."""

from __future__ import annotations

from lingbot_map_ros.ros.parameters import params
from lingbot_map_ros.tools.help_text import plain

_USAGE = """usage: {exe} [--help] [--ros-args -p NAME:=VALUE ... --params-file FILE]

{description}

Start it with the package's launch file (ros2 launch lingbot_map_ros lingbot_map.launch.py) or
directly, e.g.:
  {exe} --ros-args --params-file config/lingbot_map.yaml -p weights:=/path/to/lingbot-map.pt \\
      -r image:=/camera/color/image_raw

Parameters (name = default: description); python -m lingbot_map_ros.ros.parameters.params
prints them as a Markdown table:
"""


def wants_help(argv: list[str]) -> bool:
    """Return True when ``-h``/``--help`` comes before any ``--ros-args``."""
    head = argv[:argv.index('--ros-args')] if '--ros-args' in argv else argv
    return '-h' in head or '--help' in head


def help_text(exe: str, description: str) -> str:
    """Return the usage, ``description`` (the module docstring) and the parameter list."""
    lines = [_USAGE.format(exe=exe, description=plain(description).strip())]
    for spec in params.all_specs():
        lines.append(f'  {spec.name} = {spec.default!r}: {plain(spec.description)}')
    return '\n'.join(lines)
