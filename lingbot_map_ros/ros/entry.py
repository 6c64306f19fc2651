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
"""Console entry point of ``lingbot_map_node``: imports the node, then runs it.

Importing the node pulls in torch (about 1.5 s). A Ctrl-C in that time would print a traceback
from deep inside torch; here it ends the process quietly instead, as a Ctrl-C while spinning does.
"""

from __future__ import annotations

import sys


def main(args: list[str] | None = None) -> int:
    """Import and run :func:`lingbot_map_ros.ros.node.main`.

    Returns:
        The node's exit code; 130 when interrupted during the import.
    """
    try:
        from lingbot_map_ros.ros import node
    except KeyboardInterrupt:
        return 130
    return node.main(args)


if __name__ == '__main__':
    sys.exit(main())
