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
"""Lanes (``runner/lanes.py``): per-stream work on side streams, eagerly and in a CUDA graph.

On the CPU the work runs in order on the host (the current stream's first); on CUDA (marker
gpu) side streams run it, eagerly or captured as parallel branches of one graph, with the
numbers of the same work run on one stream.

Run: ``python -m pytest test/engine/test_lanes.py``.
"""

from __future__ import annotations

from lingbot_map_ros.engine.runner.lanes import Lanes
import pytest
import torch


def _chain(x: torch.Tensor, w: torch.Tensor, steps: int = 8) -> torch.Tensor:
    """Many dependent small kernels, as a camera head's are."""
    for _ in range(steps):
        x = torch.tanh(x @ w) + x
    return x


def test_lanes_run_the_current_work_first_then_each_lane_in_order_on_the_cpu():
    order: list[str] = []

    def lane(name: str, value: float):
        def run() -> torch.Tensor:
            order.append(name)
            return torch.full((2,), value)
        return run

    lanes_ = Lanes()
    outs = lanes_.run(torch.device('cpu'), [lane('a', 1.0), lane('b', 2.0), lane('c', 3.0)],
                      current=lambda: order.append('current'))
    assert order == ['current', 'a', 'b', 'c']
    assert [float(out[0]) for out in outs] == pytest.approx([1.0, 2.0, 3.0])
    assert lanes_.forks == 0  # nothing to overlap without CUDA


def test_a_failing_lane_raises_and_stops_the_lanes_after_it():
    order: list[str] = []

    def fail() -> None:
        raise RuntimeError('lane refused (test)')

    with pytest.raises(RuntimeError, match='lane refused'):
        Lanes().run(torch.device('cpu'), [lambda: order.append('a'), fail,
                                          lambda: order.append('c')])
    assert order == ['a']


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('overlap', [True, False], ids=['side-streams', 'one-stream'])
def test_lanes_captured_in_a_graph_replay_the_work_of_one_stream(overlap):
    torch.manual_seed(0)
    w = torch.randn(64, 64, device='cuda') / 8
    inputs = [torch.randn(128, 64, device='cuda') for _ in range(3)]
    lanes_ = Lanes(overlap)

    def batch() -> torch.Tensor:
        outs = lanes_.run(w.device, [lambda x=x: _chain(x, w) for x in inputs])
        return torch.stack(outs)

    eager = batch()  # side streams outside a capture (the warm-up of a graph)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = batch()
    for x in inputs:
        x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    want = torch.stack([_chain(x, w) for x in inputs])
    torch.testing.assert_close(captured, want, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(eager, want)  # the replay saw the new inputs
    assert lanes_.forks == (2 if overlap else 0)
