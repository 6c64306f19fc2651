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
"""bench/results/README.md lists every results folder kept in the repository."""

from pathlib import Path
import re

_RESULTS = Path(__file__).resolve().parents[2] / 'bench' / 'results'


def test_every_results_folder_has_its_row():
    listed = set(re.findall(r'^\| `(h200_[a-z0-9_]+)/', (_RESULTS / 'README.md').read_text(),
                            re.MULTILINE))
    folders = {p.name for p in _RESULTS.iterdir() if p.is_dir()}
    assert folders <= listed, sorted(folders - listed)
    assert listed <= folders, sorted(listed - folders)  # a row for a folder that is gone
