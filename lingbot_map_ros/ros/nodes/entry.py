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
"""Entry point of the node executables: signal handlers first, then the imports, then the node.

Importing the node pulls in torch (1.5 s, more on a loaded machine). The SIGINT/SIGTERM handlers
of :mod:`~lingbot_map_ros.ros.nodes.process_signals` go in before that import, so a Ctrl-C or a
``kill`` at any moment of the start-up ends the process quietly with status 0 (during those
imports at once), as one while spinning does; further signals while it stops and exits are
ignored. This module imports nothing heavy itself.
"""

from __future__ import annotations

import importlib
import sys

from lingbot_map_ros.ros.nodes.process_signals import ProcessSignals, ShutdownRequested


def main(args: list[str] | None = None) -> int:
    """Run ``lingbot_map_node`` (:class:`~lingbot_map_ros.ros.nodes.node.LingbotMapNode`).

    Returns:
        The process exit code: 0 after a clean shutdown (a signal included), 1 when the node
        could not start.
    """
    return run(args, 'lingbot_map_node', 'lingbot_map_ros.ros.nodes.node', 'LingbotMapNode')


def run(args: list[str] | None, exe: str, module: str, class_name: str) -> int:
    """Install the signal handlers, import the node class, run it until shutdown.

    Args:
        args: command line (``sys.argv`` when None).
        exe: executable name, for ``--help``.
        module: module of the node class.
        class_name: the node class in it.

    Returns:
        The process exit code (see :func:`main`).
    """
    signals = ProcessSignals()
    signals.install()
    try:
        with signals.importing():  # a signal here ends the process at once (status 0)
            node_class = getattr(importlib.import_module(module), class_name)
            from lingbot_map_ros.ros.nodes import node_process
        return node_process.run(args, node_class, exe, signals)
    except ShutdownRequested:
        return 0  # during start-up: nothing ran yet that needs more than the finally blocks
    finally:
        signals.finish()  # after a signal: further ones ignored while the process exits


if __name__ == '__main__':
    sys.exit(main())
