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
"""The occupancy grid in a saved map: written, listed, checksummed, read back as map_server would.

``~/save_map`` hands the grid's map-server files (``grid.yaml``, ``grid.pgm``) to the store as the
snapshot's optional files; they must survive a save and a load bit for bit, read back with the
format's rules (trinary: 0 occupied, 254 free, 205 unknown; negate 0), and a tampered grid or a
file name the format does not allow must be refused.

Run: ``pytest test/engine/loop/test_map_grid_files.py`` (CPU, a second).
"""

from dataclasses import replace
import json

from lingbot_map_ros.engine.errors import MapLoadError
from lingbot_map_ros.engine.map.grid_cells import FREE, GridView, OCCUPIED, UNKNOWN
from lingbot_map_ros.engine.map.grid_files import map_server_files
from lingbot_map_ros.engine.mapping.store.map_load import load_map
from lingbot_map_ros.engine.mapping.store.map_store import save_map
import numpy as np
import pytest
from test_map_store import _snapshot, EXPECT
import yaml


def _grid() -> GridView:
    data = np.full((5, 7), UNKNOWN, np.int8)
    data[1:4, 1:6] = FREE
    data[0, :] = OCCUPIED
    return GridView(data=data, resolution=0.05, origin_x=-1.25, origin_y=0.5)


def _read_map_server(meta: bytes, pgm: bytes) -> tuple[dict, np.ndarray]:
    """Read a trinary map the way nav2's map_server does: p = (255 - v) / 255 (negate 0)."""
    spec = yaml.safe_load(meta)
    magic, comment, size, maxval, rest = pgm.split(b'\n', 4)
    assert magic == b'P5' and comment.startswith(b'#') and maxval == b'255'
    width, height = (int(v) for v in size.split())
    pixels = np.frombuffer(rest, np.uint8).reshape(height, width)
    p = (255.0 - pixels) / 255.0
    cells = np.full(pixels.shape, UNKNOWN, np.int8)
    cells[p > spec['occupied_thresh']] = OCCUPIED
    cells[p < spec['free_thresh']] = FREE
    return spec, cells[::-1]  # the image's first row is the highest y


def test_a_saved_map_keeps_its_grid_and_map_server_reads_it_back(tmp_path) -> None:
    grid = _grid()
    folder = save_map(tmp_path / 'map', replace(_snapshot(), extra_files=map_server_files(
        'grid', grid)), durable=False)
    meta = json.loads((folder / 'metadata.json').read_text())
    assert {'grid.yaml', 'grid.pgm'} <= set(meta['files'])
    loaded = load_map(folder, EXPECT)
    assert set(loaded.extra_files) == {'grid.yaml', 'grid.pgm'}
    spec, cells = _read_map_server(loaded.extra_files['grid.yaml'], loaded.extra_files['grid.pgm'])
    assert spec['image'] == 'grid.pgm' and spec['mode'] == 'trinary' and spec['negate'] == 0
    assert spec['resolution'] == pytest.approx(0.05)
    assert spec['origin'][:2] == pytest.approx([-1.25, 0.5])
    np.testing.assert_array_equal(cells, grid.data)
    # Saved again (a loaded map in localization mode), the grid goes with it.
    again = load_map(save_map(tmp_path / 'again', loaded, durable=False), EXPECT)
    assert again.extra_files == loaded.extra_files


def test_a_tampered_grid_or_an_unknown_optional_file_is_refused(tmp_path) -> None:
    folder = save_map(tmp_path / 'map', replace(_snapshot(), extra_files=map_server_files(
        'grid', _grid())), durable=False)
    pgm = bytearray((folder / 'grid.pgm').read_bytes())
    pgm[-1] ^= 0xFF
    (folder / 'grid.pgm').write_bytes(bytes(pgm))
    with pytest.raises(MapLoadError, match='grid.pgm'):
        load_map(folder, EXPECT)
    with pytest.raises(ValueError, match='notes.txt'):
        save_map(tmp_path / 'other', replace(_snapshot(), extra_files={'notes.txt': b'x'}),
                 durable=False)
