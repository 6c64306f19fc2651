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
"""``save_map`` never deletes a user's files, and cleans up after killed saves (#46 item 10).

Run: ``pytest test/engine/loop/test_map_save_guard.py`` (CPU; about a second).
"""

import os
from pathlib import Path
import subprocess
import sys
import time

from lingbot_map_ros.engine.mapping.store import map_store
from lingbot_map_ros.engine.mapping.store.map_load import load_map
from lingbot_map_ros.engine.mapping.store.map_store import remove_stale_saves, save_map
import pytest
from test_map_store import _snapshot, EXPECT


def _dead_pid() -> int:
    """Return the id of a process that has just ended."""
    child = subprocess.Popen([sys.executable, '-c', 'pass'])
    child.wait()
    return child.pid


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob('*'))


def test_a_folder_with_user_files_beside_a_metadata_is_never_replaced(tmp_path: Path) -> None:
    """The hostile corpus's case: metadata.json, notes.txt and a bag; before, both were lost."""
    folder = tmp_path / 'maps'
    folder.mkdir()
    (folder / 'metadata.json').write_text('{"my": "own metadata"}')
    (folder / 'notes.txt').write_text('keep me')
    (folder / 'recording_001.bag').write_bytes(b'\x00' * 1000)
    with pytest.raises(ValueError, match='other content than a map'):
        save_map(folder, _snapshot(), durable=False)
    assert _tree(folder) == ['metadata.json', 'notes.txt', 'recording_001.bag']
    assert (folder / 'notes.txt').read_text() == 'keep me'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['maps']  # no hidden folder left


@pytest.mark.parametrize('extra', ['notes.txt', 'images/mine.jpg', 'sub/deep.txt', 'link'])
def test_a_map_folder_holding_anything_else_is_never_replaced(tmp_path: Path, extra) -> None:
    folder = save_map(tmp_path / 'm', _snapshot(seed=1), durable=False)
    path = folder / extra
    if extra == 'link':
        path.symlink_to(tmp_path)
    else:
        path.parent.mkdir(exist_ok=True)
        path.write_text('keep me')
    before = _tree(folder)
    poses = (folder / 'poses.npy').read_bytes()
    first = extra.split('/')[0] if extra.startswith('sub') else extra
    with pytest.raises(ValueError, match=f"holds '{first}', which is not part of the map"):
        save_map(folder, _snapshot(seed=2), durable=False)
    assert _tree(folder) == before
    assert (folder / 'poses.npy').read_bytes() == poses


def test_metadata_of_another_format_or_unparsable_is_never_replaced(tmp_path: Path) -> None:
    for n, text in enumerate(('not json', '[1, 2]', '{"format": "other.map", "files": {}}',
                              '{"format": "lingbot_map_ros.map"}')):
        folder = tmp_path / f'f{n}'
        folder.mkdir()
        (folder / 'metadata.json').write_text(text)
        with pytest.raises(ValueError, match='other content than a map'):
            save_map(folder, _snapshot(), durable=False)
        assert (folder / 'metadata.json').read_text() == text


def test_an_empty_folder_or_our_own_map_is_replaced(tmp_path: Path) -> None:
    (tmp_path / 'empty').mkdir()
    save_map(tmp_path / 'empty', _snapshot(seed=1), durable=False)
    assert load_map(tmp_path / 'empty', EXPECT).graph.num_keyframes == 12
    second = _snapshot(num=16, seed=2)
    save_map(tmp_path / 'empty', second, durable=False)
    assert load_map(tmp_path / 'empty', EXPECT).graph.poses.tobytes() == \
        second.graph.poses.tobytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['empty']


def test_a_file_that_appears_during_the_replacement_is_kept(tmp_path: Path,
                                                            monkeypatch) -> None:
    folder = save_map(tmp_path / 'm', _snapshot(seed=1), durable=False)
    real = map_store._exchange

    def exchange_late(a: Path, b: Path) -> bool:
        (b / 'late.txt').write_text('written after the check')  # a user's write, racing
        return real(a, b)
    monkeypatch.setattr(map_store, '_exchange', exchange_late)
    save_map(folder, _snapshot(seed=2), durable=False)
    assert load_map(folder, EXPECT).graph.poses.tobytes() == \
        _snapshot(seed=2).graph.poses.tobytes()
    kept = [p for p in tmp_path.iterdir() if p.name != 'm']
    assert len(kept) == 1 and kept[0].name.startswith(f'.m.replaced-{os.getpid()}-')
    assert _tree(kept[0]) == ['late.txt']  # the old map's files gone, the user's file kept


def test_stale_hidden_saves_are_removed_at_the_next_save(tmp_path: Path) -> None:
    dead = _dead_pid()
    stale = tmp_path / f'.m.saving-{dead}-0123abcd'
    (stale / 'images').mkdir(parents=True)
    (stale / 'poses.npy').write_bytes(b'\x00' * 4096)
    ours = tmp_path / f'.m.saving-{os.getpid()}-0123abcd'  # a save under way in this process
    ours.mkdir()
    alive = tmp_path / '.m.saving-1-0123abcd'  # pid 1 runs: another node's save, young
    alive.mkdir()
    other = tmp_path / f'.other.saving-{dead}-0123abcd'  # another map's: not this one's
    other.mkdir()
    named = tmp_path / '.m.saving-notes'  # not a name save_map makes
    named.mkdir()
    save_map(tmp_path / 'm', _snapshot(), durable=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ['m', ours.name, alive.name, other.name, named.name])


def test_remove_stale_saves_at_start(tmp_path: Path) -> None:
    dead = _dead_pid()
    old = tmp_path / '.m.saving-1-00000000'
    old.mkdir()
    day_ago = time.time() - map_store.STALE_AFTER_S - 60
    os.utime(old, (day_ago, day_ago))  # its pid runs again, but it is a day old
    replaced = save_map(tmp_path / f'.m.replaced-{dead}-0000beef', _snapshot(), durable=False)
    (replaced / 'mine.txt').write_text('a user file in an old map')
    link = tmp_path / f'.m.saving-{dead}-0000cafe'
    link.symlink_to(tmp_path / 'elsewhere')
    assert remove_stale_saves(tmp_path / 'm') == [old]
    assert _tree(replaced) == ['mine.txt']  # the map's files gone, not the user's
    assert link.is_symlink()
    assert remove_stale_saves(tmp_path / 'nowhere' / 'm') == []
