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
"""The start-up phase of the node processes' signal handlers (no rclpy needed)."""

import os
import signal
import subprocess
import sys

from lingbot_map_ros.ros.nodes.process_signals import ProcessSignals, ShutdownRequested
import pytest


@pytest.fixture
def signals():
    handlers = ProcessSignals()
    handlers.install()
    yield handlers
    handlers.uninstall()


def test_a_start_up_signal_raises_at_once(signals):
    with pytest.raises(ShutdownRequested):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000_000):  # the handler runs at the next bytecode boundary
            pass
    assert signals.requested and signals.received == 'SIGTERM'


_IMPORTING = """
import os, signal, time
from lingbot_map_ros.ros.nodes.process_signals import ProcessSignals

signals = ProcessSignals()
signals.install()
try:
    with signals.importing():
        print('importing', flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30.0)  # an import of torch on a loaded machine: not waited for
        print('import ended')
finally:
    print('finally ran')
"""


def test_a_signal_during_the_imports_ends_the_process_at_once_with_status_0():
    done = subprocess.run([sys.executable, '-c', _IMPORTING], capture_output=True, text=True,
                          timeout=20.0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ['importing'] and done.stderr == ''


def test_an_importing_block_without_a_signal_and_the_running_phase_raise_nothing(signals):
    with signals.importing():
        pass
    signals.running()
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100_000):
        pass
    assert signals.requested  # only recorded: the main loop stops the node in order


_START_UP = '''
import os, signal, sys
from lingbot_map_ros.ros.nodes.process_signals import ProcessSignals, ShutdownRequested
from lingbot_map_ros.ros.nodes import node_process


class HalfMadeNode:
    """A signal lands mid-construction and the unwinding fails on the half-made state."""

    def __init__(self):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000_000):
                pass
        except ShutdownRequested:
            [].remove(0)  # as rclpy's entity lists can fail (ValueError)


class BadParameterNode:
    def __init__(self):
        raise ValueError('model.preset: no such preset')


signals = ProcessSignals()
signals.install()
print('bad parameter ->', node_process.run(['node'], BadParameterNode, 'node', signals))
try:
    node_process.run(['node'], HalfMadeNode, 'node', signals)
    print('half-made -> returned')
except ShutdownRequested as exc:
    print('half-made -> shutdown', exc)
'''


def test_a_start_up_error_the_signal_caused_is_the_shutdown_not_a_fatal_start():
    # The start-up signal can surface inside rclpy's bookkeeping; the ValueError its
    # unwinding then raises must still end the process as the shutdown (status 0), while the
    # same error without a signal stays a start-up error (one FATAL line, status 1).
    done = subprocess.run([sys.executable, '-c', _START_UP], capture_output=True, text=True,
                          timeout=120.0)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines == ['bad parameter -> 1', 'half-made -> shutdown SIGTERM'], done.stdout
    assert 'cannot start: model.preset: no such preset' in done.stderr
    assert 'cannot start: list.remove' not in done.stderr and 'Traceback' not in done.stderr


def test_finish_after_a_signal_ignores_further_ones_and_without_one_restores():
    # The interpreter's exit resets Python handlers to the default (a second Ctrl-C would kill
    # the exiting process by the signal); "ignore" survives it.
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    quiet = ProcessSignals()
    quiet.install()
    quiet.finish()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    stopped = ProcessSignals()
    stopped.install()
    stopped.running()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):
            pass
        assert stopped.requested
        stopped.finish()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
