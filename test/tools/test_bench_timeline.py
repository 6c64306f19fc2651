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
"""The tick timeline (``tools/bench_timeline.py``) on a hand-made trace with known answers.

Run: ``python -m pytest test/tools/test_bench_timeline.py``.
"""

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.tools.bench_timeline import profile_ticks, RecordFunctionSpans, summarise, \
    TICK
import pytest
import torch


def _span(name, cat, ts, dur, **args):
    return {'ph': 'X', 'name': name, 'cat': cat, 'ts': ts, 'dur': dur, 'args': args}


def _trace():
    """Return two ticks of 1000 us with known answers.

    Tick 1: host 'plan' 0-200, 'batch graph' 200-300 launching a GEMM (300-700), on a side
    stream an FA3 kernel (400-800), then PyTorch's flash kernel (800-850); 'wait (sync)'
    300-1000. Tick 2 (at 2000): no device work, 'finish' covers 2100-2500.
    """
    return [
        _span('tick', 'user_annotation', 0, 1000),
        _span('plan', 'user_annotation', 0, 200),
        _span('batch graph', 'user_annotation', 200, 100),
        _span('cudaGraphLaunch', 'cuda_runtime', 250, 10, correlation=7),
        _span('nvjet_sm90_tst_128x128', 'kernel', 300, 400, correlation=7),
        _span('cutlass::device_kernel<flash::FlashAttnFwdSm90<...>>', 'kernel', 400, 400,
              correlation=7),
        _span('void pytorch_flash::flash_fwd_kernel<...>', 'kernel', 800, 50, correlation=7),
        _span('wait (sync)', 'user_annotation', 300, 700),
        _span('tick', 'user_annotation', 2000, 1000),
        _span('finish', 'user_annotation', 2100, 400),
        _span('aten::add', 'cpu_op', 2100, 5),
    ]


def test_busy_idle_and_their_split_by_step_and_kind():
    got = summarise(_trace())
    assert got['ticks'] == 2
    assert got['wall_ms'] == pytest.approx(1.0)
    # Busy 300-850 (two kernels overlap) in tick 1, nothing in tick 2: 0.275 ms a tick.
    assert got['busy_ms'] == pytest.approx(0.275)
    assert got['idle_ms'] == pytest.approx(0.725)
    assert got['idle_before_first_ms'] == pytest.approx(0.15)  # 300 us in tick 1
    assert got['idle_after_last_ms'] == pytest.approx(0.075)   # 150 us in tick 1
    # Tick 1's idle: 0-200 plan, 200-300 replay, 850-1000 sync; tick 2: 100 unlabelled
    # before and 500 after 'finish', 400 in it.
    assert got['idle_by_step_ms'] == pytest.approx(
        {'plan': 0.1, 'batch graph': 0.05, 'wait (sync)': 0.075, 'finish': 0.2, '-': 0.3})
    # Summed device time (the overlap counted twice), both launched by the replay.
    # PyTorch's flash kernel is frame attention, not FA3 (both names hold 'flash::').
    assert got['kernel_ms_by_kind'] == pytest.approx(
        {'GEMM': 0.2, 'cache attention (FA3)': 0.2, 'frame attention': 0.025})
    assert got['kernel_ms_by_step'] == pytest.approx({'batch graph': 0.425})
    assert got['kernels'] == 1.5


def test_profile_ticks_lends_the_engine_its_spans_and_then_puts_the_profiler_back():
    engine = Engine.load(EngineConfig.from_flat({'model.preset': 'tiny', 'stream.device': 'cpu'}),
                         allow_random_weights=True)
    before = RecordFunctionSpans()
    engine.set_profiler(before)
    lent = []

    def run(spans):
        lent.append(spans)
        assert engine.profiler is spans  # the engine records into the ticks' spans
        with spans.span(TICK), spans.span('plan'):
            torch.ones(4).sum()

    summary, table = profile_ticks(run, engine, torch.device('cpu'))
    assert len(lent) == 1 and lent[0] is not before
    assert engine.profiler is before
    assert summary['ticks'] == 1 and set(summary['idle_by_step_ms']) <= {'plan', '-'}

    def fails(spans):
        raise RuntimeError('tick failed')

    with pytest.raises(RuntimeError, match='tick failed'):
        profile_ticks(fails, engine, torch.device('cpu'))
    assert engine.profiler is before
