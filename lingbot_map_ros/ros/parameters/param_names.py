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
"""Names given to the node or a tool that it does not know: refused, with the nearest known names.

One check for ``lingbot_map_node``, ``lingbot_map_lifecycle_node`` and the tools that read the
node's parameter file (``lingbot_map_replay``, ``lingbot_map_bench``): a misspelled parameter
(``cache.scale_frame``, ``stream.image_widht``) would otherwise leave the default in place
without a word. This module imports neither rclpy nor torch, so the tools use it without ROS.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
import difflib

ROS_PARAMETERS = frozenset({'use_sim_time', 'start_type_description_service'})
"""Parameters rclpy declares on every node (known to any node, set by launch files)."""
REMOVED: dict[str, str] = {
    'frames.map_axes': 'removed: poses are base_frame in odom_frame, x forward, y left, z up, '
                       'docs/odometry.md; lingbot_map_replay run has --map-axes',
}
"""Parameters of earlier versions, with what replaced them."""
_NEAREST = 3
_CUTOFF = 0.6
_MARGIN = 0.05
"""Names this much less similar than the closest one are not offered."""


def unknown_problem(names: Iterable[str], known: Collection[str], kind: str = 'parameter',
                    listed: str = 'docs/parameters.md lists every parameter') -> str | None:
    """Return why some of ``names`` are refused (unknown, with the nearest known), or None.

    Args:
        names: the parameter names given (a parameter file's keys, ``-p`` names, ``--set`` keys).
        known: every name the reader accepts.
        kind: what a name is, for the message ('parameter', 'launch argument').
        listed: where the known names are listed, the message's last words.

    Returns:
        None when every name is known; else one line naming each unknown one and, for each, the
        closest known names (``difflib``) or what replaced it.
    """
    unknown = sorted(set(names) - set(known) - ROS_PARAMETERS)
    if not unknown:
        return None
    parts = [f"'{name}' ({_hint(name, known)})" for name in unknown]
    noun = kind if len(unknown) == 1 else kind + 's'
    return f"unknown {noun} {', '.join(parts)}; {listed}"


def _hint(name: str, known: Collection[str]) -> str:
    if name in REMOVED:
        return REMOVED[name]
    close = difflib.get_close_matches(name, list(known), n=_NEAREST, cutoff=_CUTOFF)
    if close:
        best = _similarity(name, close[0])
        close = [k for k in close if _similarity(name, k) >= best - _MARGIN]
    if not close:  # a known field in the wrong section: cache.keyframe_interval
        leaf = name.rpartition('.')[2]
        close = sorted(k for k in known if k.rpartition('.')[2] == leaf)[:_NEAREST]
    return 'did you mean ' + ' or '.join(close) + '?' if close else 'no similar name'


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()
