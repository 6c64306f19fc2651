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
"""faiss's import does not log its instruction-set probing at INFO."""

import subprocess
import sys

import pytest

_IMPORT = """
import logging
logging.basicConfig(level=logging.DEBUG, format='%(levelname)s %(name)s: %(message)s')
from lingbot_map_ros.engine.optional_dependencies import faiss_or_none
print('faiss', faiss_or_none() is not None)
print('level after', logging.getLogger('faiss.loader').level)
"""


def test_faiss_loads_without_info_noise_and_its_logger_level_is_restored():
    pytest.importorskip('faiss')
    done = subprocess.run([sys.executable, '-c', _IMPORT], capture_output=True, text=True,
                          timeout=120.0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ['faiss True', 'level after 0']
    noise = [line for line in done.stderr.splitlines() if 'faiss.loader' in line]
    assert noise == [], noise
