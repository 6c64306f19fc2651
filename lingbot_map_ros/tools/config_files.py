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
"""find_config and parse_set: the package's parameter files and ``--set KEY=VALUE`` flags.

Apart from the replay tool so that tools without rosbags (``bench map``) can find them too.
"""

from pathlib import Path
import sys
from typing import Any

import yaml

PACKAGE = 'lingbot_map_ros'


def find_config(name: str) -> Path:
    """Find a parameter file shipped in the package's ``config/`` folder.

    Looks in the source tree first (running from a checkout), then in the installed share folder
    (``<python prefix>/share/lingbot_map_ros/config``, or the ament index of a colcon install).

    Raises:
        FileNotFoundError: the file is in neither place.
    """
    candidates = [Path(__file__).resolve().parents[2] / 'config' / name,
                  Path(sys.prefix) / 'share' / PACKAGE / 'config' / name]
    try:  # a colcon install: the share folder is known to the ament index
        from ament_index_python.packages import get_package_share_directory
        candidates.append(Path(get_package_share_directory(PACKAGE)) / 'config' / name)
    except (ImportError, LookupError, OSError):  # OSError: no AMENT_PREFIX_PATH
        pass
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f'{name} not found in ' + ' or '.join(map(str, candidates)))


def parse_set(items: list[str]) -> dict[str, Any]:
    """``['cache.scale_frames=4', ...]`` -> ``{'cache.scale_frames': 4}`` (values read as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got '{item}'")
        out[key.strip()] = yaml.safe_load(value)
    return out
