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
"""``lingbot_map_launch`` as a user starts it without ros2cli: a process, the real launch wheels.

The process is the console script's entry point on this interpreter, with the package NOT on
the ament index (a pip install): the entry lays out its own install prefix. It must start the
node with the given arguments (poses come back on the remapped topic, in the namespace), and
stop on SIGINT with exit status 0.
"""

import itertools
import os
from pathlib import Path
import signal
import subprocess
import sys

import pytest
from test_launch import params_file as launch_params, probe_launch

pytestmark = [pytest.mark.rostest, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
_ns = itertools.count()


params_file = launch_params  # the fixture: the test engine, bag-mode input


def _default_sigint() -> None:
    # A shell without job control starts background jobs with SIGINT ignored, and an ignored
    # signal stays ignored across exec: the process would never see the Ctrl-C this test sends
    # when the suite itself runs in the background (as `bash .ci/run &`). A user's terminal
    # gives the default; so does this.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_the_console_script_starts_the_node_and_stops_cleanly_on_sigint(params_file, tmp_path):
    pytest.importorskip('launch_ros')
    namespace = f'/entry{os.getpid()}_{next(_ns)}'
    env = {k: v for k, v in os.environ.items() if k != 'AMENT_PREFIX_PATH'}
    code = ('import sys\nfrom lingbot_map_ros.ros.nodes.launch_entry import main\n'
            'sys.exit(main())\n')
    # Its output goes to a file: a pipe nobody reads while the probe runs could fill and stall it.
    log_path = tmp_path / 'launch.log'
    log = open(log_path, 'w', encoding='utf-8')
    proc = subprocess.Popen(
        [sys.executable, '-c', code, f'namespace:={namespace}', f'params_file:={params_file}',
         'image_topic:=cam/image_raw', 'allow_random_weights:=true', 'log_level:=warn'],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_default_sigint)
    got, problem = None, None
    try:
        got = probe_launch(namespace, 3)
    except AssertionError as exc:
        problem = exc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    out = log_path.read_text(encoding='utf-8')
    assert problem is None, f'{problem}; the process said:\n{out[-4000:]}'
    assert len(got['poses']) >= 3
    assert [p.header.stamp.sec * 1_000_000_000 + p.header.stamp.nanosec
            for p in got['poses'][:3]] == got['stamps']
    assert got['params']['model.preset'] == 'tiny'
    assert proc.returncode == 0, out[-3000:]
    assert 'Traceback' not in out, out[-3000:]
