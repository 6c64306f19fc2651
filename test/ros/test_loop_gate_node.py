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
"""The pose graph's own loop gate, through the real node (rclpy graph, CPU, oracle network).

The scene of ``test_loop_node.py`` (a route driven twice, drifting odometry, the landmark
verifier), with a verifier that lies about a few pairs: it accepts them with a relative pose
1.5 units and 25 degrees off the truth, as a verifier fooled by a look-alike place would. Only
the graph (``PoseGraph.add_loop``: the gate) stands between those loops and the map, so a graph
that accepted every loop fails here: the lies are accepted and the map path bends.

Run: ``pytest test/ros/test_loop_gate_node.py`` (needs gtsam; ~30 s on 2 busy cores;
``rostest``).
"""

from dataclasses import replace
from pathlib import Path
import sys

from lingbot_map_ros.engine import sim3
from node_harness import Graph, wait_for  # noqa: F401
import numpy as np
import pytest
from test_loop_node import _TIMEOUT_S, feed_route, LAP, NUM, settled, start  # noqa: I100

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine' / 'loop'))
from loop_scenes import ate, Places, rotation, route  # noqa: E402,I100,I202
from place_oracle import drifting  # noqa: E402,I100,I202

pytest.importorskip('gtsam')
pytestmark = pytest.mark.rostest

LIES = range(LAP + 14, LAP + 20)
"""Query keyframes (second lap) whose verification lies."""
LIE = sim3.make(rotation([0.2, 1.0, 0.1], np.radians(25.0)), [1.5, 0.0, 0.0])
"""What the lying verifier multiplies the true relative pose with."""


class LyingVerifier:
    """The landmark verifier, but the pairs of :data:`LIES` come back accepted and wrong."""

    def __init__(self, honest) -> None:
        """Wrap ``honest`` (a ``LandmarkVerifier``)."""
        self.honest = honest
        self.lied: list[tuple[int, int]] = []

    def verify(self, query, candidate):
        """Verify honestly; falsify the relative pose of a lie (``Verifier`` protocol)."""
        result = self.honest.verify(query, candidate)
        if query.index not in LIES or not result.accepted:
            return result
        self.lied.append((query.index, candidate.index))
        return replace(result, relative=result.relative @ LIE)


@pytest.fixture(scope='module')
def graph():
    g = Graph()
    yield g
    g.close()


def test_the_graph_rejects_loops_that_a_fooled_verifier_accepted(graph):
    truth = route(LAP, lap_offset=0.1)
    odometry = drifting(truth)
    places = Places(truth, LAP)
    node, probe, rec, honest, oracle = start(graph, places, odometry, truth)
    liar = LyingVerifier(honest)
    node.core.pipeline.loop_output.feed.use_verifier(liar)
    feed_route(probe, NUM, node, rec)
    wait_for(lambda: rec.count('odometry') >= NUM, _TIMEOUT_S, f'{NUM} odometry messages')
    wait_for(lambda: settled(node, NUM), _TIMEOUT_S, 'every keyframe closed')
    closer = node.core.pipeline.loop_output.feed.closer
    stats = closer.stats()
    edges = closer.loop_edges()
    lied = {(q, c) for q, c in liar.lied}
    assert lied, 'no lie was ever verified: the test would prove nothing'
    told = [e for e in edges if (e.query, e.candidate) in lied]
    honest_edges = [e for e in edges if (e.query, e.candidate) not in lied]
    assert len(told) == len(lied)
    assert not any(e.accepted for e in told), [(e.query, e.candidate) for e in told]
    assert stats['rejected_graph'] >= len(lied)
    assert sum(e.accepted for e in honest_edges) >= 5, stats
    # The map path: the true loops corrected it, the lies did not bend it.
    corrected = closer.corrected_poses()
    assert ate(corrected, truth) <= 0.3 * ate(odometry, truth), (ate(corrected, truth),
                                                                 ate(odometry, truth))
