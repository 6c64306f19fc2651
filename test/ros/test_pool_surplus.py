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
"""A page pool sized for more streams than the node opens is warned about at start, with its cost.

``cache.streams: 64`` with one camera used to start silently with a pool 64 times the size it
uses; the node now says so in one WARN with the bytes nothing uses.
"""

from __future__ import annotations

import dataclasses
import itertools

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.ros.parameters import param_checks
from node_harness import no_callback_errors, TINY_CPU, wait_for  # noqa: F401 - autouse fixture
import pytest
from rclpy.parameter import Parameter
from test_input_watch import Rosout

pytestmark = pytest.mark.rostest
_ns = itertools.count()


def _tiny_config(**cache) -> EngineConfig:
    base = EngineConfig.from_flat({k: v for k, v in TINY_CPU.items()
                                   if k.split('.')[0] in ('model', 'cache', 'stream')})
    return dataclasses.replace(base, cache=dataclasses.replace(base.cache, **cache))


def test_a_pool_for_the_cameras_only_gets_no_warning():
    assert param_checks.pool_surplus(_tiny_config(), 1) is None
    assert param_checks.pool_surplus(_tiny_config(streams=2), 2) is None
    one = param_checks.pool_need(_tiny_config(), 1)[0]
    assert param_checks.pool_surplus(_tiny_config(pool_pages=one), 1) is None


def test_more_streams_than_cameras_are_warned_with_the_bytes_unused():
    config = _tiny_config(streams=64)
    one, pages, size_hw = param_checks.pool_need(config, 1)
    assert pages == 64 * one
    spare = param_checks.pool_bytes(config, 63 * one, size_hw)
    warning = param_checks.pool_surplus(config, 1)
    assert warning.startswith(f'cache.streams=64 sizes a KV page pool of {pages} pages')
    assert f'{spare / 2**30:.2f} GiB is never used' in warning
    assert warning.endswith('Set cache.streams to 1')
    oversized = param_checks.pool_surplus(_tiny_config(pool_pages=10 * one), 1)
    assert oversized.startswith(f'cache.pool_pages={10 * one} sizes')
    assert oversized.endswith(f'Set cache.pool_pages to {one} or 0')


def test_the_node_warns_at_start(graph):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    ns = f'/surplus_{next(_ns)}'
    rosout = Rosout(graph, f'{ns.strip("/")}.lingbot_map')
    node = graph.add(LingbotMapNode(
        context=graph.context, namespace=ns,
        parameter_overrides=[Parameter(k, value=v)
                             for k, v in {**TINY_CPU, 'cache.streams': 64}.items()]))
    try:
        warnings = wait_for(lambda: rosout.find(30, 'cache.streams=64 sizes'), 60.0, 'the WARN')
        assert len(warnings) == 1 and 'GiB is never used' in warnings[0]
    finally:
        graph.remove(node)
