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
"""``output.directory``: its default, and the absolute folder a value names.

``~/save`` writes under it (``publishers/map_save.py``), the map reuse services read and write
there (``publishers/map_reuse.py``), and the parameter checks refuse a value that does not resolve
(``param_checks.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
import re

DEFAULT_DIRECTORY = '~/.ros/lingbot_map'
"""Default of ``output.directory``."""


def resolve_directory(text: str, name: str = 'output.directory') -> Path:
    """Expand ``~`` and ``$VARS`` of ``output.directory`` into an absolute path.

    Args:
        text: the parameter's value.
        name: the parameter the messages name (``loop.image_folder`` is resolved alike).

    Returns:
        The absolute directory (a relative value is taken from the node's working directory).

    Raises:
        ValueError: empty, an unset environment variable, or an unknown ``~user`` (each would
            otherwise write into the working directory or a literal ``$VAR`` folder).
    """
    if not text.strip():
        raise ValueError(f"{name} is empty (the default is '{DEFAULT_DIRECTORY}')")
    expanded = os.path.expanduser(text)
    if expanded.startswith('~'):
        raise ValueError(f'{name}={text!r} names an unknown user')
    expanded = os.path.expandvars(expanded)
    unset = re.search(r'\$(\w+|\{[^}]*\})', expanded)
    if unset:
        raise ValueError(f'{name}={text!r} holds {unset.group(0)}, which is not set '
                         "in the node's environment")
    return Path(expanded).absolute()
