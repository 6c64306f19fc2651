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
"""``~/grid`` of lingbot_map_node on a real rclpy graph (tiny engine, CPU, depth on).

A subscriber that joins after the keyframes gets the latched grid (transient local) in
``odom`` (loop closure off), equal to the engine grid's view, with its ``~/grid_metadata``;
``~/save`` writes it as map-server files that read back to the same cells; a node started
with a bad ``grid.*`` value is refused with one line.

Run: ``pytest test/ros/test_grid_node.py`` (10-20 s on 2 cores; marker ``rostest``).
"""

import itertools
from pathlib import Path
import sys

from lingbot_map_ros.ros.publishers.grid_output import GRID_QOS
from nav_msgs.msg import MapMetaData, OccupancyGrid
from node_harness import image_msg, make_image, stamp_ns, TINY_CPU, wait_for
import numpy as np
import pytest
from rclpy.node import Node
from std_srvs.srv import Trigger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
from test_occupancy_grid import read_map_server  # noqa: E402,I100,I202

pytestmark = pytest.mark.rostest

_TIMEOUT_S = 60.0
_SEC = 1_000_000_000
_ns = itertools.count()
_NUM_FRAMES = 6


def start(graph, out_dir, **grid):
    values = {**TINY_CPU, 'input.queue_mode': 'bag', 'input.qos.reliability': 'reliable',
              'input.qos.depth': 100, 'stream.enable_depth': True, 'map.period_s': 0.1,
              'map.voxel_size': 0.001, 'map.confidence_percentile': 0.0,
              'grid.period_s': 0.1, 'grid.min_height': -100.0, 'grid.max_height': 100.0,
              'output.directory': str(out_dir), **grid}
    return graph.start_node(f'/grid{next(_ns)}', values)


def test_late_subscriber_gets_the_grid_and_save_writes_it(graph, tmp_path):
    node, probe = start(graph, tmp_path / 'saves')
    sent = [int((30.0 + 0.1 * i) * _SEC) for i in range(_NUM_FRAMES)]
    for i, t in enumerate(sent):
        probe.image_pub.publish(image_msg(make_image(i), t))
    wait_for(lambda: probe.count(probe.poses) >= _NUM_FRAMES, _TIMEOUT_S, 'poses')
    output = node.core.pipeline.map_output.grid
    engine_grid = output.grid
    wait_for(lambda: engine_grid.stats()['num_traced'] == _NUM_FRAMES, _TIMEOUT_S,
             'every keyframe traced')

    listener = graph.add(Node(f'late_{next(_ns)}', namespace=node.get_namespace(),
                              context=graph.context))
    grids, metas = [], []
    listener.create_subscription(OccupancyGrid, 'lingbot_map/grid', grids.append, GRID_QOS)
    listener.create_subscription(MapMetaData, 'lingbot_map/grid_metadata', metas.append,
                                 GRID_QOS)
    msg = wait_for(lambda: next((m for m in grids if stamp_ns(m) == sent[-1]), None),
                   _TIMEOUT_S, 'a latched ~/grid with the last keyframe')
    wait_for(lambda: metas, _TIMEOUT_S, 'a latched ~/grid_metadata')
    view = engine_grid.view()
    assert msg.header.frame_id == 'odom'
    assert (msg.info.width, msg.info.height) == (view.width, view.height)
    assert msg.info.width * msg.info.height == len(msg.data) > 0
    assert msg.info.resolution == pytest.approx(0.05)
    assert (msg.info.origin.position.x, msg.info.origin.position.y) == \
        pytest.approx((view.origin_x, view.origin_y))
    cells = np.array(msg.data, np.int8).reshape(msg.info.height, msg.info.width)
    assert cells.tolist() == view.data.tolist()
    assert set(np.unique(cells).tolist()) <= {-1, 0, 100}
    assert (cells != -1).any()  # the band takes every point: the keyframes marked cells
    assert metas[-1].width == msg.info.width and metas[-1].height == msg.info.height
    graph.remove(listener)

    reply = probe.call(probe.create_client(Trigger, 'lingbot_map/save'), Trigger.Request())
    assert reply.success, reply.message
    folder = Path(reply.message)
    assert read_map_server(folder / 'grid.yaml').tolist() == view.data.tolist()


def test_a_bad_grid_value_is_refused_at_start(graph, tmp_path):
    with pytest.raises(Exception, match='grid.resolution') as info:
        start(graph, tmp_path, **{'grid.resolution': 1e-5})
    assert '\n' not in str(info.value).strip()


def test_the_cell_bound_holds_on_the_published_grid_and_is_counted(graph, tmp_path):
    node, probe = start(graph, tmp_path, **{'grid.max_cells': 64, 'grid.resolution': 0.01})
    sent = [int((40.0 + 0.1 * i) * _SEC) for i in range(3)]
    for i, t in enumerate(sent):
        probe.image_pub.publish(image_msg(make_image(i), t))
    engine_grid = node.core.pipeline.map_output.grid.grid
    wait_for(lambda: probe.count(probe.poses) >= 3, _TIMEOUT_S, 'poses')

    def settled():
        stats = engine_grid.stats()
        added = stats['num_scans'] + stats['num_dropped_far'] + stats['num_dropped_old']
        return added == 3 and stats['num_pending'] == 0 and not stats['dirty']

    wait_for(settled, _TIMEOUT_S, 'every keyframe traced or dropped')
    stats = engine_grid.stats()
    assert stats['width'] * stats['height'] <= 64
    assert stats['num_cells_outside'] + stats['num_dropped_far'] > 0
    view = engine_grid.view()
    assert view.width * view.height <= 64
