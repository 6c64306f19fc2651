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
"""``lingbot_map_replay run --grid``: the occupancy grid written offline as map-server files.

A synthetic bag through the random-weight tiny model on CPU (its depth is meaningless, so the
band takes every height): ``grid.yaml`` + ``grid.pgm`` are written without ``--ply``'s
``map.ply``, and read back by map_server's rules they are the grid of the same keyframes.
"""

from pathlib import Path
import sys

from lingbot_map_ros.tools.replay import find_config, main
import numpy as np
import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'engine'))
from test_occupancy_grid import read_map_server  # noqa: E402,I100,I202

torch.set_num_threads(1)
FAST = ['--set', 'stream.image_width=112', '--set', 'cache.scale_frames=2', '--set',
        'cache.sliding_window=4']


@pytest.mark.slow
def test_run_grid_writes_map_server_files(tmp_path):
    bag = tmp_path / 'bag'
    assert main(['make-bag', '--synthetic', '--frames', '8', '--size', '128x72',
                 '--out', str(bag), '--storage', 'mcap']) == 0
    out = tmp_path / 'out'
    assert main(['run', str(bag), '--out', str(out), '--params-file',
                 str(find_config('demo_tiny_cpu.yaml')), '--torch-threads', '1', *FAST,
                 '--grid', '--set', 'grid.min_height=-100', '--set', 'grid.max_height=100',
                 '--set', 'grid.resolution=0.02', '--set', 'grid.max_range=10']) == 0
    meta = yaml.safe_load((out / 'grid.yaml').read_text())
    assert meta['mode'] == 'trinary' and meta['image'] == 'grid.pgm'
    assert meta['resolution'] == pytest.approx(0.02)
    cells = read_map_server(out / 'grid.yaml')
    assert cells.size > 1 and set(np.unique(cells).tolist()) <= {-1, 0, 100}
    assert (cells == 100).any() and (cells == 0).any()
    assert not (out / 'map.ply').exists()  # --grid alone writes no point map
