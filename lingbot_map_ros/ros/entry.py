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
