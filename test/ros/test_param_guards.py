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
"""Every numeric parameter against NaN, +-inf, huge, zero, negative and empty (issue 22).

The parameters come from the ParamSpec table itself, so a parameter added later is tried too.
Each hostile value is either refused with a reason naming the parameter, at start-up (the node
does not start) and at run time (``set_parameters`` answers unsuccessful), or listed in
:data:`ACCEPTED`, which docs/parameters.md documents (0 turns a feature off, and so on).
"""

from __future__ import annotations

import math

from lingbot_map_ros.ros.parameters import params
from node_harness import TINY_CPU
import pytest
from rcl_interfaces.msg import Parameter as ParameterMsg
from rclpy.exceptions import ParameterException
from rclpy.parameter import Parameter

HOSTILE = ('nan', '+inf', '-inf', 'huge', 'zero', 'negative', 'empty')

ACCEPTED: frozenset[tuple[str, str]] = frozenset({
    ('seed', 'zero'),
    ('input.backwards_reset_s', 'zero'),     # every step back resets the session
    ('input.forward_jump_s', 'zero'),        # the forward-jump check is off
    ('publish.path_max_poses', 'zero'),      # ~/path is off
    ('map.confidence_percentile', 'zero'),   # every pixel kept
    ('map.min_confidence', 'zero'),          # no confidence floor
    ('model.num_dino_registers', 'zero'),    # a model without registers
    ('model.tap_layers', 'zero'),            # every head reads layer 0
    ('frames.base_to_camera', 'negative'),   # (-1, -1, -1) m, quaternion normalised
    ('cache.pool_pages', 'zero'),            # the pool's size derived from the configuration
    ('metric.max_range_m', 'zero'),          # no range limit on the sensor depth
    ('metric.depth_wait_s', 'zero'),         # a colour frame never waits for its depth
    ('input.sync_tolerance_s', 'zero'),      # only frames of equal stamps are one group
    ('diagnostics.no_input_warn_s', 'zero'),  # the no-input warning is off
    ('loop.min_score', 'zero'),              # any positively correlated place is a candidate
    ('loop.min_score', 'negative'),          # every place is a candidate
    ('loop.exclude_recent', 'zero'),         # recent keyframes may be candidates too
    ('loop.separation', 'zero'),             # near-duplicate candidates kept
    ('loop.min_inlier_fraction', 'zero'),    # no inlier floor (the residual gates still hold)
    ('loop.image_store_mb', 'zero'),         # no keyframe images kept
    ('cache.kernel.fa3_joint_tail_rows', 'zero'),  # FA3 keeps every run's tail rows
    ('cache.kernel.fa3_splits', 'zero'),     # FA3's own split heuristic
    ('grid.min_height', 'zero'),             # obstacles from base_frame's ground plane up
    ('grid.min_height', 'negative'),         # base_frame above the floor: the band reaches below
    ('imu.time_offset_s', 'zero'),           # IMU and camera on one clock
    ('imu.time_offset_s', 'negative'),       # the IMU's clock behind the camera's
    ('imu.gyro_range', 'zero'),              # no saturation check
    ('imu.accel_range', 'zero'),             # no saturation check
    ('imu.min_rate_hz', 'zero'),             # no rate floor (max_gap_s still holds)
})
"""(parameter, hostile value) pairs that are valid settings (docs/parameters.md)."""


def _numeric_specs() -> list[params.ParamSpec]:
    return [s for s in params.all_specs('tiny')
            if isinstance(s.default, (int, float, list)) and not isinstance(s.default, bool)]


def _value(spec: params.ParamSpec, kind: str) -> Parameter:
    """Build the hostile ``kind`` for ``spec``, typed as a user would send it."""
    is_list = isinstance(spec.default, list)
    is_int = all(isinstance(v, int) for v in spec.default) if is_list \
        else isinstance(spec.default, int)
    scalar = {'nan': math.nan, '+inf': math.inf, '-inf': -math.inf,
              'huge': 2 ** 62 if is_int else 1e308, 'zero': 0 if is_int else 0.0,
              'negative': -1 if is_int else -1.0}.get(kind)
    if kind == 'empty':
        if is_list:
            array = Parameter.Type.INTEGER_ARRAY if is_int else Parameter.Type.DOUBLE_ARRAY
            return Parameter(spec.name, array, [])
        return Parameter(spec.name, value='')
    if is_list:
        return Parameter(spec.name, value=[scalar] * len(spec.default))
    return Parameter(spec.name, value=scalar)


CASES = [(spec.name, kind) for spec in _numeric_specs() for kind in HOSTILE]


def test_every_numeric_parameter_is_enumerated():
    names = {name for name, _ in CASES}
    assert {'map.voxel_size', 'map.period_s', 'map.min_confidence', 'frames.base_to_camera',
            'diagnostics.period_s', 'output.max_poses', 'model.embed_dim'} <= names
    assert len(names) == len(_numeric_specs()) >= 40


@pytest.mark.parametrize('name,kind', CASES)
def test_start_up_refuses_or_documents_every_hostile_value(graph, name, kind):
    from lingbot_map_ros.ros.nodes.node import LingbotMapNode

    spec = next(s for s in _numeric_specs() if s.name == name)
    overrides = [Parameter(k, value=v) for k, v in TINY_CPU.items() if k != name]
    overrides.append(_value(spec, kind))
    try:
        node = LingbotMapNode(context=graph.context, namespace=f'/pg_start_{abs(hash(name))}',
                              parameter_overrides=overrides)
    except (ValueError, ParameterException) as exc:
        assert (name, kind) not in ACCEPTED, f'{name}={kind} refused: {exc}'
        # The reason names the parameter (ours) or its whole range (rclpy's).
        assert name in str(exc) or 'range' in str(exc).lower() or 'type' in str(exc).lower(), \
            str(exc)
        return
    try:
        assert (name, kind) in ACCEPTED, f'{name}={kind} was accepted at start-up'
    finally:
        node.destroy_node()


@pytest.fixture(scope='module')
def running(graph):
    node, probe = graph.start_node('/pg_run', dict(TINY_CPU))
    yield node, probe
    graph.remove(probe)
    graph.remove(node)


@pytest.mark.parametrize('name,kind', CASES)
def test_run_time_refuses_or_documents_every_hostile_value(running, name, kind):
    node, probe = running
    spec = next(s for s in _numeric_specs() if s.name == name)
    before = node.get_parameter(name).value
    msg = _value(spec, kind).to_parameter_msg()
    result = _set(probe, msg)
    if (name, kind) in ACCEPTED and not spec.read_only:
        assert result.successful, result.reason
        _set(probe, Parameter(name, value=before).to_parameter_msg())
        return
    assert not result.successful, f'{name}={kind} was accepted at run time'
    assert result.reason, f'{name}={kind} refused without a reason'
    assert node.get_parameter(name).value == before or (
        isinstance(before, float) and math.isnan(before))


def _set(probe, msg: ParameterMsg):
    from rcl_interfaces.srv import SetParameters

    request = SetParameters.Request(parameters=[msg])
    return probe.call(probe.param_client, request).results[0]


def test_the_refusal_reasons_name_the_problem():
    specs = {s.name: s for s in params.all_specs('tiny')}
    assert 'not a finite number' in params.check_value(specs['map.min_confidence'], math.nan)
    assert '[1e-06, 1e+06]' in params.check_value(specs['map.voxel_size'], 1e-300)
    assert '[0.05, 3600]' in params.check_value(specs['map.period_s'], 1e-9)
    assert 'may not be empty' in params.check_value(specs['frames.odom_frame'], '')
    values = {'frames.odom_frame': 'odom', 'frames.base_frame': 'odom', 'frames.map_frame': ''}
    assert "both 'odom'" in params.param_checks.check_frames(values)
    values = {'frames.odom_frame': 'odom', 'frames.base_frame': 'base', 'frames.map_frame': 'odom'}
    assert 'frames.map_frame' in params.param_checks.check_frames(values)
    assert 'not set' in params.check_value(specs['output.directory'], '$LINGBOT_UNSET_X/maps')
    assert 'empty' in params.check_value(specs['output.directory'], '')
