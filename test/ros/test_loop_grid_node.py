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
"""``~/grid`` with loop closure through the real node: in ``map``, moved by every correction.

The route of test_loop_map_node.py (driven twice with a drifting heading, the oracle's room
depth): with loop closure ``~/grid`` is in ``map``, each keyframe's scan carries its anchored
piece's corrected pose, the grid was rebuilt after the corrections, and every occupied cell lies
within one cell of the corrected point map (which test_loop_map_node.py shows has no double
wall); the band takes every height, so the whole room is obstacle.

Run: ``pytest test/ros/test_loop_grid_node.py`` (needs gtsam; about a minute on 2 busy cores).
"""

from pathlib import Path
import sys

from nav_msgs.msg import OccupancyGrid
from node_harness import stamp_ns, wait_for
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_loop_map_node as loop_map  # noqa: E402,I100,I202
from test_loop_node import feed_route, NUM, settled  # noqa: E402,I100,I202

pytest.importorskip('gtsam')
pytestmark = pytest.mark.rostest

_TIMEOUT_S = 120.0
RESOLUTION = 0.1


def test_the_grid_follows_the_corrected_keyframes(graph, monkeypatch):
    from lingbot_map_ros.ros.publishers.grid_output import GRID_QOS

    grid_values = {'grid.period_s': 0.1, 'grid.resolution': RESOLUTION,
                   'grid.min_height': -100.0, 'grid.max_height': 100.0, 'grid.max_range': 50.0}
    start_node = graph.start_node
    monkeypatch.setattr(graph, 'start_node',
                        lambda ns, values, **kw: start_node(ns, {**values, **grid_values}, **kw))
    node, probe, oracle, _ = loop_map.start(graph, loop=True)
    grids = []
    probe.create_subscription(OccupancyGrid, 'lingbot_map/grid', grids.append, GRID_QOS)
    feed_route(probe, NUM, node)
    wait_for(lambda: settled(node, NUM), _TIMEOUT_S, 'every keyframe closed')
    closer = node.core.pipeline.loop_output.feed.closer
    map_output = node.core.pipeline.map_output
    anchored, grid = map_output.anchored, map_output.grid.grid
    wait_for(lambda: map_output.graph_key is not None and
             map_output.graph_key[1] == closer.version, _TIMEOUT_S,
             'the map moved by the last correction')

    def grid_follows():
        stats = grid.stats()
        if stats['num_pending'] or stats['dirty'] or stats['num_scans'] != NUM:
            return False
        poses, placed = anchored.poses(), grid.poses()
        return all(placed[k] is not None and np.allclose(placed[k], poses[k], atol=1e-9)
                   for k in poses)
    wait_for(grid_follows, _TIMEOUT_S, 'every scan placed as its piece and traced')
    assert closer.version >= 5 and grid.stats()['num_rebuilds'] >= 1

    view = grid.view()
    msg = wait_for(lambda: next((m for m in reversed(grids) if m.info.width == view.width and
                                 m.info.height == view.height and
                                 bytes(np.array(m.data, np.int8).tobytes()) ==
                                 view.data.tobytes()), None),
                   _TIMEOUT_S, 'the rebuilt grid published')
    assert msg.header.frame_id == 'map' and stamp_ns(msg) > 0

    # Every occupied cell within one cell of the corrected point map's own cells.
    xyz, _ = anchored.points()
    cells = np.floor(xyz[:, :2] / RESOLUTION).astype(np.int64)
    near = {(int(x) + dx, int(y) + dy) for x, y in np.unique(cells, axis=0)
            for dx in (-1, 0, 1) for dy in (-1, 0, 1)}
    rows, cols = np.nonzero(view.data == 100)
    x0 = int(round(view.origin_x / RESOLUTION))
    y0 = int(round(view.origin_y / RESOLUTION))
    occupied = {(x0 + int(c), y0 + int(r)) for r, c in zip(rows, cols)}
    assert len(occupied) > 50
    stray = occupied - near
    assert not stray, (len(stray), len(occupied))
