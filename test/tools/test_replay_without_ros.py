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
"""``lingbot_map_replay`` without ROS: make-bag works, play says what it needs.

A child Python whose import of rclpy / rosgraph_msgs fails stands in for a pip-only install.
Run: ``python -m pytest test/tools/test_replay_without_ros.py`` (a few seconds).
"""

from __future__ import annotations

from pathlib import Path
import subprocess
import sys

_BLOCK_ROS = """
import builtins, sys
real_import = builtins.__import__
def no_ros(name, *args, **kwargs):
    if name.split('.')[0] in ('rclpy', 'rosgraph_msgs'):
        raise ImportError(f'No module named {name!r}')
    return real_import(name, *args, **kwargs)
builtins.__import__ = no_ros
from lingbot_map_ros.tools import replay
sys.exit(replay.main(sys.argv[1:]))
"""


def _replay(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', _BLOCK_ROS, *args], capture_output=True,
                          text=True, timeout=120)


def test_make_bag_runs_and_play_explains_without_rclpy(tmp_path: Path):
    bag = tmp_path / 'bag'
    made = _replay('make-bag', '--synthetic', '--frames', '3', '--out', str(bag))
    assert made.returncode == 0, made.stderr
    assert (bag / 'metadata.yaml').is_file()
    play = _replay('play', str(bag), '--rate', '2')
    assert play.returncode == 1
    assert 'play needs rclpy' in play.stderr
