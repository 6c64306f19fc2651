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
"""Loop closure without its optional packages: a clear ImportError, numpy search, 'unavailable'.

Run: ``pytest test/engine/loop/test_loop_dependencies.py`` (CPU, instant).
"""

import sys

from lingbot_map_ros.engine import optional_dependencies as dependencies
from lingbot_map_ros.engine.loop import optimize_pose_graph
from lingbot_map_ros.engine.mapping.graph.pose_graph import PoseGraph
from lingbot_map_ros.engine.mapping.places.place_index import PlaceIndex
import numpy as np
import pytest


def test_without_gtsam_the_graph_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, 'gtsam', None)  # import gtsam raises ImportError
    reason = dependencies.missing()
    assert reason is not None and 'pip install gtsam' in reason
    with pytest.raises(ImportError, match='loop closure needs gtsam'):
        PoseGraph()
    with pytest.raises(ImportError, match='loop closure needs gtsam'):
        optimize_pose_graph(np.eye(4)[None], [])


def test_without_faiss_the_index_searches_with_numpy(monkeypatch):
    monkeypatch.setitem(sys.modules, 'faiss', None)
    index = PlaceIndex()
    assert index.backend == 'numpy'
    rng = np.random.default_rng(0)
    places = rng.normal(size=(5, 16))
    for k in range(20):
        index.add(k, places[k % 5] + 0.001 * k)  # each visit a little different
    found = index.search(places[2] + 0.0125, 19, k=2, min_score=0.99, exclude_recent=5,
                         separation=0)
    assert [c.index for c in found] == [12, 7]  # the closest visits of place 2, old enough
    assert 0.99 < found[1].score < found[0].score <= 1.0
