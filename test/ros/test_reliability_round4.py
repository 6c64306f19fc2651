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
"""Issue #36 on the real rclpy node (tiny CPU model): settings refused at start, with a reason.

Page pools that cannot pose every camera, or do not fit the device, and camera names that are
not topic names were start-up tracebacks (or a node that never published) on e67d60d; each is
now a ``ValueError`` naming the parameter and what would work, before any weight is loaded.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.ros.parameters import param_checks
from node_harness import TINY_CPU
import pytest
from rclpy.parameter import Parameter

_ns = itertools.count()


def _start(graph, values):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    overrides = [Parameter(k, value=v) for k, v in {**TINY_CPU, **values}.items()]
    return LingbotMapNode(context=graph.context, namespace=f'/round4_{next(_ns)}',
                          parameter_overrides=overrides)


def _tiny_config(**cache) -> EngineConfig:
    base = EngineConfig.from_flat({k: v for k, v in TINY_CPU.items()
                                   if k.split('.')[0] in ('model', 'cache', 'stream')})
    return dataclasses.replace(base, cache=dataclasses.replace(base.cache, **cache))


def test_the_pool_a_camera_needs_at_the_reference_size():
    config = _tiny_config()
    one, pages, size_hw = param_checks.pool_need(config, 1)
    # 112 wide, 4:3 -> 112x84: 8 x 6 = 48 patches a page; N_s + W + 1 = 8 patch pages,
    # ceil(6 * 320 / 48) = 40 special pages, and the rollover's 3 + 1 scale pages.
    assert size_hw == (84, 112) and one == 8 + 40 + 4 and pages == one
    assert param_checks.check_pool(config, 1, memory_bytes=2**40) is None
    assert param_checks.check_pool(_tiny_config(pool_pages=one), 1, 2**40) is None
    reason = param_checks.check_pool(_tiny_config(pool_pages=one * 2 - 1), 2, 2**40)
    assert 'cache.pool_pages=103' in reason and 'at least 104' in reason


def test_a_pool_larger_than_the_device_is_refused_with_its_bytes():
    one_gib = 2**30
    config = _tiny_config(streams=1024)
    need = param_checks.pool_bytes(config, param_checks.pool_need(config, 1)[1], (84, 112))
    # 1024 streams x 52 pages x 48 tokens x 2 heads x 64 dims x 4 layers x K, V x 4 bytes.
    assert need == 1024 * 52 * 48 * 2 * 64 * 4 * 2 * 4
    reason = param_checks.check_pool(config, 1, memory_bytes=4 * one_gib)
    assert reason.startswith('cache.streams=1024') and '9.8 GiB' in reason
    assert param_checks.check_pool(config, 1, memory_bytes=64 * one_gib) is None


@pytest.mark.parametrize('values, message', [
    ({'cache.pool_pages': 1}, r'cache.pool_pages=1 cannot pose 1 camera\(s\).*at least 52'),
    ({'cache.pool_pages': 30}, 'cache.pool_pages=30 cannot pose'),
    ({'cache.pool_pages': 40, 'input.cameras': ['front', 'left']},
     r'cannot pose 2 camera\(s\).*at least 104'),
    ({'cache.pool_pages': 100_000_000}, r'cache.pool_pages=100000000 sizes .* GiB'),
    ({'input.cameras': ['front\n']}, r"'front\\n' is not a valid camera name"),
    ({'input.cameras': ['f' * 300]}, r'\(300 characters\) is not a valid camera name'),
    ({'input.cameras': ['front', 'c' * 5000]}, r'\(5000 characters\).*at most 64'),
])
def test_settings_that_never_pose_are_refused_at_start(graph, values, message):
    with pytest.raises(ValueError, match=message):
        _start(graph, values)


def test_a_pool_that_fits_starts(graph):
    node = _start(graph, {'cache.pool_pages': 104, 'input.cameras': ['front', 'left']})
    try:
        assert node.core.pipeline.config.cache.pool_pages == 104
    finally:
        node.destroy_node()


def _frame(camera: str, index: int, num_bytes: int) -> Any:
    from lingbot_map_ros.ros.inference.session_runner import InputFrame
    from sensor_msgs.msg import Image

    msg = Image(height=1, width=num_bytes, encoding='mono8', step=num_bytes)
    msg.header.stamp.sec = index
    msg.data = bytes(num_bytes)
    return InputFrame(msg, False, 0.0, camera)


def test_the_frame_queue_is_bounded_in_bytes_live_drops_the_oldest():
    from lingbot_map_ros.ros.inference.worker import FrameQueue

    queue = FrameQueue(100, block_when_full=False, max_bytes=1000)
    dropped = [queue.put(_frame('', i, 300)) for i in range(5)]
    assert dropped == [0, 0, 0, 1, 1] and len(queue) == 3 and queue.num_bytes == 900
    assert queue.put(_frame('', 5, 5000)) == 3  # alone over the bound: still taken
    assert len(queue) == 1 and queue.get(0.1).msg.header.stamp.sec == 5
    assert queue.num_bytes == 0


def test_the_bag_queue_blocks_on_bytes_instead_of_growing():
    from lingbot_map_ros.ros.inference.worker import FrameQueue

    queue = FrameQueue(100, block_when_full=True, max_bytes=1000)
    for i in range(3):
        assert queue.put(_frame('', i, 300)) == 0
    done = threading.Event()
    thread = threading.Thread(target=lambda: (queue.put(_frame('', 3, 300)), done.set()))
    thread.start()
    assert not done.wait(0.3)  # full in bytes: the put waits (the worker takes one next)
    assert queue.get(0.1).msg.header.stamp.sec == 0
    assert done.wait(30.0)  # safety net only: the put returns as soon as room is made
    thread.join()
    assert len(queue) == 3 and queue.num_bytes == 900


def test_the_cameras_live_queue_is_bounded_in_bytes_each_drop_on_its_camera():
    from lingbot_map_ros.ros.inference.camera_group import CameraQueue

    counted: dict[str, int] = {}
    queue = CameraQueue(4, 64, block_when_full=False, max_bytes=1000,
                        count_overflow=lambda n, k: counted.update({n: counted.get(n, 0) + k}))
    for name in ('a', 'b', 'c'):
        assert queue.put(_frame(name, 0, 300)) == 0
    assert queue.put(_frame('a', 1, 300)) == 1  # replaces a's own waiting frame
    assert queue.put(_frame('d', 0, 300)) == 0  # over 1000 bytes: b's frame (the oldest) goes
    assert counted == {'b': 1} and queue.num_bytes == 900
    assert sorted(i.camera for i in (queue.get(0.1), queue.get(0.1), queue.get(0.1))) == [
        'a', 'c', 'd']


def test_engine_status_shows_the_backend_in_use_not_auto():
    from test_diagnostics import FRESH, SESSION

    from lingbot_map_ros.ros.publishers import diagnostics
    from lingbot_map_ros.ros.publishers.diagnostics import NodeStats

    auto = dataclasses.replace(SESSION, backend='auto')  # its cache says 'sdpa'
    for session, expected in ((auto, 'sdpa'),
                              (dataclasses.replace(FRESH, backend='auto'),
                               'auto (resolved at the first frame)'),
                              (FRESH, 'sdpa')):
        status = diagnostics.engine_status('n', NodeStats().roll(), session, 3)
        values = {kv.key: kv.value for kv in status.values}
        assert values['backend'] == expected


def test_an_all_zero_checkpoint_is_refused_as_such(graph, tmp_path):
    import torch

    from lingbot_map_ros.engine.errors import WeightsError
    from lingbot_map_ros.engine.model.gct import LingbotMapModel

    config = _tiny_config()
    state = {k: torch.zeros_like(v) for k, v in LingbotMapModel(config.model).state_dict().items()}
    path = tmp_path / 'zero.pt'
    torch.save(state, path)
    # e67d60d: 'quaternion_to_rotation: zero or non-finite quaternion' from the warm-up.
    with pytest.raises(WeightsError, match='every value of the checkpoint is zero'):
        _start(graph, {'weights': str(path), 'allow_random_weights': False})


def test_an_output_directory_too_long_for_the_file_system_is_refused_at_set_time(graph):
    from node_harness import Probe

    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    namespace = f'/round4_dir{next(_ns)}'
    node = graph.add(LingbotMapNode(
        context=graph.context, namespace=namespace,
        parameter_overrides=[Parameter(k, value=v) for k, v in TINY_CPU.items()]))
    probe = graph.add(Probe(graph.context, namespace))
    long_path, long_name = '/tmp/' + 'a/' * 50_000, '/tmp/' + 'b' * 300
    results = probe.set_params(output__directory=long_path)
    assert not results[0].successful and '4096-byte path limit' in results[0].reason
    results = probe.set_params(output__directory=long_name)
    assert not results[0].successful and 'name of 300 bytes' in results[0].reason
    assert probe.set_params(output__directory='/tmp/maps_round4')[0].successful
    assert node.get_parameter('output.directory').value == '/tmp/maps_round4'
    graph.remove(probe)
    graph.remove(node)
