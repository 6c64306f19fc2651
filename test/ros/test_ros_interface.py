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
"""The node's interface table, a running node and docs/ros_interface.md agree.

``ros/parameters/interface.py`` is what ``--help`` prints. A real node (tiny CPU model, every
output on: depth, cloud, metric depth input, loop closure) is asked through the ROS graph which
topics it publishes and subscribes to and which services it offers, and which diagnostics
statuses it sends; the table must name exactly those, and the docs page exactly the table's
topics and services and the node's statuses. A topic or service added to the node without a
row here, or a row without the node's, fails. Run: ``pytest test/ros/test_ros_interface.py``.
"""

from pathlib import Path
import re

from lingbot_map_ros.ros.parameters import interface
from node_harness import no_callback_errors, TINY_CPU, wait_for  # noqa: F401 - autouse fixture
import pytest
from rclpy.parameter import Parameter

pytestmark = pytest.mark.rostest

_DOCS = Path(__file__).resolve().parents[2] / 'docs' / 'ros_interface.md'
# rclpy's own endpoints of every node, and TF's (the table's TRANSFORMS say what the node does).
_INFRASTRUCTURE = {'/rosout', '/parameter_events', '/tf', '/tf_static'}
_ALL_ON = {**TINY_CPU, 'loop.enable': True, 'stream.enable_depth': True, 'publish.depth': True,
           'publish.cloud': True, 'metric.source': 'depth'}


def _resolved(name: str, namespace: str) -> str:
    if name.startswith('/'):
        return name
    if name.startswith('~/'):
        return f'{namespace}/lingbot_map/{name[2:]}'
    return f'{namespace}/{name}'


def _names(pairs) -> set[str]:
    return {name for name, _ in pairs if name not in _INFRASTRUCTURE}


def _types(kind: str, namespace: str) -> dict[str, str]:
    return {_resolved(e.name, namespace): e.type.replace('/', '/msg/' if kind != 'service'
                                                         else '/srv/', 1)
            for e in interface.of_kind(kind)}


@pytest.fixture(scope='module')
def running(graph):
    """Yield a node with every output on, and what the graph says it has."""
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    namespace = '/iface'
    node = graph.add(LingbotMapNode(
        context=graph.context, namespace=namespace,
        parameter_overrides=[Parameter(k, value=v) for k, v in _ALL_ON.items()]))
    me = (node.get_name(), node.get_namespace())
    found = {
        'publishes': dict(node.get_publisher_names_and_types_by_node(*me)),
        'subscribes': dict(node.get_subscriber_names_and_types_by_node(*me)),
        'service': {name: types for name, types in node.get_service_names_and_types_by_node(*me)
                    if not name.rpartition('/')[2].endswith(
                        ('_parameters', '_parameter_types', '_parameters_atomically',
                         'get_type_description'))},
    }
    yield node, namespace, found
    graph.remove(node)


@pytest.mark.parametrize('kind', interface.KINDS)
def test_the_table_names_every_endpoint_of_a_running_node_with_its_type(running, kind):
    _, namespace, found = running
    table = _types(kind, namespace)
    if kind == 'subscribes':  # raw transport: not the compressed one
        table.pop(_resolved('image/compressed', namespace))
    assert _names(found[kind].items()) == set(table)
    for name, types in found[kind].items():
        if name not in _INFRASTRUCTURE:
            assert types == [table[name]], name


def test_the_compressed_input_is_the_tables_too(graph):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    node = graph.add(LingbotMapNode(
        context=graph.context, namespace='/iface_jpeg',
        parameter_overrides=[Parameter(k, value=v) for k, v in
                             {**TINY_CPU, 'input.transport': 'compressed'}.items()]))
    try:
        me = (node.get_name(), node.get_namespace())
        subs = dict(node.get_subscriber_names_and_types_by_node(*me))
        table = _types('subscribes', '/iface_jpeg')
        assert subs['/iface_jpeg/image/compressed'] == [
            table['/iface_jpeg/image/compressed']]
        assert '/iface_jpeg/image' not in subs
    finally:
        graph.remove(node)


def _section(title: str) -> str:
    text = _DOCS.read_text()
    start = text.index(f'\n## {title}\n')
    end = text.find('\n## ', start + 1)
    return text[start:end if end > 0 else None]


def test_the_docs_list_the_tables_topics_and_services():
    rows = [line.split('|') for line in _section('Topics').splitlines()
            if line.startswith(('| sub |', '| pub |'))]
    documented = {(cells[1].strip(), cells[2].strip().strip('`')) for cells in rows}
    expected = {('sub' if e.kind == 'subscribes' else 'pub',
                 '<image>/compressed' if e.name == 'image/compressed' else e.name)
                for e in interface.ENDPOINTS if e.kind != 'service'}
    assert documented - {('pub', '/tf')} == expected
    mentioned = set(re.findall(r'`(~/[a-z_]+)`', _section('Services')))
    services = {e.name for e in interface.of_kind('service')}
    assert services <= mentioned
    assert mentioned - services <= {e.name for e in interface.ENDPOINTS}  # topics it names
    lifecycle = _section('Lifecycle (managed) node')
    configure = next(line for line in lifecycle.splitlines() if line.startswith('| `configure`'))
    assert all(f'`{e.name}`' in configure for e in interface.of_kind('service'))


def test_the_docs_list_the_statuses_the_node_sends(graph, running):
    node, namespace, _ = running
    received = []
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    listener = graph.add(Node('iface_diagnostics', context=graph.context))
    listener.create_subscription(DiagnosticArray, '/diagnostics', received.append,
                                 QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
    prefix = f'{namespace.lstrip("/")}/lingbot_map: '
    try:
        wait_for(lambda: sum(any(s.name.startswith(prefix) for s in a.status)
                             for a in list(received)) >= 3, 60.0, 'three diagnostics periods')
        statuses = {s.name[len(prefix):] for a in list(received) for s in a.status
                    if s.name.startswith(prefix)}
    finally:
        graph.remove(listener)
    section = _section('Diagnostics')
    table = {line.split('|')[1].strip() for line in section.splitlines()
             if line.startswith('| ') and not line.startswith(('| status', '|---'))}
    named = set(re.findall(r'`<node>: ([a-z]+)`', section.split('|')[0]))
    assert statuses == table, (statuses, table)
    assert named - {'cameras'} == statuses
    count = {4: 'four', 5: 'five', 6: 'six'}[len(statuses)]
    assert f'There are {count} statuses' in section
