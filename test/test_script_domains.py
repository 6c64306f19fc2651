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
"""The DDS domain the scripts and the ROS tests pick when none is set.

ROS 2 documents domain ids 0-101 as safe on Linux (higher ones can collide with the ports of
other participants); each script's own ``export`` lines run in bash many times, unset, must stay
in that range, spread (parallel runs apart) and keep discovery on the host.
"""

from pathlib import Path
import re
import subprocess

import pytest

_ROOT = Path(__file__).resolve().parents[1]
_SAFE = range(0, 102)
_SCRIPTS = ['scripts/demo.sh', 'scripts/test.sh', 'scripts/colcon_smoke.sh']


def _exports(script: str) -> str:
    lines = (_ROOT / script).read_text().splitlines()
    return '\n'.join(line for line in lines
                     if line.startswith(('export ROS_DOMAIN_ID=',
                                         'export ROS_AUTOMATIC_DISCOVERY_RANGE=')))


@pytest.mark.parametrize('script', _SCRIPTS)
def test_a_script_picks_a_safe_spread_domain_and_local_discovery(script):
    exports = _exports(script)
    assert 'ROS_DOMAIN_ID' in exports, script
    loop = (f'for i in $(seq 300); do unset ROS_DOMAIN_ID ROS_AUTOMATIC_DISCOVERY_RANGE\n'
            f'{exports}\necho "$ROS_DOMAIN_ID $ROS_AUTOMATIC_DISCOVERY_RANGE"; done')
    out = subprocess.run(['bash', '-c', loop], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split('\n')[:-1]
    domains = [int(line.split()[0]) for line in out]
    assert len(domains) == 300
    assert all(d in _SAFE for d in domains), sorted(set(domains) - set(_SAFE))
    assert len(set(domains)) > 50  # random, so two runs at once rarely share one
    assert {line.split()[1] for line in out} == {'LOCALHOST'}
    kept = subprocess.run(['bash', '-c', f'export ROS_DOMAIN_ID=7\n{exports}\n'
                           'echo $ROS_DOMAIN_ID'], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()
    assert kept == '7'  # the user's choice wins


def test_the_ros_tests_pick_a_safe_domain():
    conftest = (_ROOT / 'test' / 'ros' / 'conftest.py').read_text()
    low, high = map(int, re.search(
        r"setdefault\('ROS_DOMAIN_ID', str\(random\.randint\((\d+), (\d+)\)\)\)",
        conftest).groups())
    assert 0 <= low and high <= 101 and high - low > 50
    assert "setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')" in conftest
