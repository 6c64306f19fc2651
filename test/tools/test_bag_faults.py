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
"""``lingbot_map_replay run`` on damaged bags: drops counted, broken storage ends cleanly.

Bad messages are counted drops; broken storage ends the run cleanly with what was read written.

Each bag is written here, then damaged in its sqlite file: message blobs truncated, replaced by
garbage or given an invalid UTF-8 frame_id, or one database page overwritten.
"""

import json
from pathlib import Path
import sqlite3

from lingbot_map_ros.tools import bag_io
from lingbot_map_ros.tools.replay import find_config, main
import numpy as np
import torch

SEC = 1_000_000_000
FAST = {'stream.image_width': 112, 'cache.scale_frames': 2, 'cache.sliding_window': 4}
SET_FLAGS = [a for k, v in FAST.items() for a in ('--set', f'{k}={v}')]
FRAME_ID = 'cam_optical'

torch.set_num_threads(1)


def _write_bag(path: Path, num: int) -> list[int]:
    stamps = [10 * SEC + i * SEC // 10 for i in range(num)]
    with bag_io.BagWriter(path) as writer:
        for i, stamp in enumerate(stamps):
            rgb = np.random.default_rng(i).integers(0, 255, (48, 64, 3), dtype=np.uint8)
            writer.write('/img', stamp, bag_io.image_message(rgb, stamp, FRAME_ID))
    return stamps


def _damage_messages(bag: Path, edits: dict[int, object]) -> None:
    """Replace message blobs by index (in recording order); a callable edits the old blob."""
    con = sqlite3.connect(next(bag.glob('*.db3')))
    rows = con.execute('SELECT id, data FROM messages ORDER BY timestamp').fetchall()
    for index, edit in edits.items():
        row_id, data = rows[index]
        con.execute('UPDATE messages SET data = ? WHERE id = ?', (edit(bytes(data)), row_id))
    con.commit()
    con.close()


def _run(bag: Path, out: Path) -> int:
    return main(['run', str(bag), '--out', str(out), '--params-file',
                 str(find_config('demo_tiny_cpu.yaml')), '--torch-threads', '1', *SET_FLAGS])


def _tum_stamps(path: Path) -> list[int]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith('#')]
    return [round(float(line.split()[0]) * 1e9) for line in lines]


def test_bad_messages_are_counted_drops_and_the_run_goes_on(tmp_path):
    bag = tmp_path / 'bag'
    stamps = _write_bag(bag, 10)
    garbage = np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes()
    _damage_messages(bag, {
        3: lambda data: data[:20],  # truncated CDR
        5: lambda data: garbage,  # not CDR at all
        7: lambda data: data.replace(FRAME_ID.encode(), b'\xff\xfe' * 5 + b'\xfd'),
    })
    out = tmp_path / 'out'
    assert _run(bag, out) == 0
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['drops'] == {'bad_message': 3}
    assert summary['frames_read'] == 10 and summary['storage_error'] is None
    kept = [s for i, s in enumerate(stamps) if i not in (3, 5, 7)]
    assert _tum_stamps(out / 'trajectory.tum') == kept


def test_broken_storage_stops_cleanly_with_what_was_read_written(tmp_path):
    bag = tmp_path / 'bag'
    stamps = _write_bag(bag, 30)
    db = next(bag.glob('*.db3'))
    page = sqlite3.connect(db).execute('PRAGMA page_size').fetchone()[0]
    data = bytearray(db.read_bytes())
    start = len(data) // 2 // page * page  # a page of the messages table, mid-file
    data[start:start + page] = np.random.default_rng(1).integers(
        0, 256, page, dtype=np.uint8).tobytes()
    db.write_bytes(bytes(data))
    out = tmp_path / 'out'
    assert _run(bag, out) == 2
    summary = json.loads((out / 'summary.json').read_text())
    assert 'database disk image is malformed' in summary['storage_error']
    assert 0 < summary['frames_read'] < len(stamps)
    written = _tum_stamps(out / 'trajectory.tum')
    assert written == stamps[:len(written)] and len(written) == summary['poses'] > 0
