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
"""The node's side of its parameters: declared once at start, changes checked at run time.

The table itself (names, defaults, ranges, which are live, the configurations built from the
values) is :mod:`~lingbot_map_ros.ros.parameters.params`; here it meets ``rclpy``:
:func:`declare_all` refuses unknown names, declares every parameter and checks the whole set
before the node builds anything, and :func:`check_changes` is the node's ``set_parameters``
callback's verdict on a batch of changes.
"""

from __future__ import annotations

from typing import Any

from lingbot_map_ros import config
from lingbot_map_ros.ros.parameters import input_params, param_checks
from lingbot_map_ros.ros.parameters.params import (all_specs, check_names, check_value,
                                                   engine_config, engine_specs, LOOP_SECTION,
                                                   metric_problem)


def given_values(node: Any) -> dict[str, Any] | None:
    """Return the parameters given to ``node`` (files, ``-p``, overrides) by name, or None.

    rclpy has no public accessor for them: its ``automatically_declare_parameters_from_overrides``
    would declare them all, but it fails on an empty list from a YAML file (``input.cameras:
    []``, typed NOT_SET). ``Node._parameter_overrides`` holds exactly the names rcl resolved
    for this node (node-targeted ``-p name:param:=``, wildcards, remapped node names); it exists
    in rclpy 7.1 (Jazzy) and 9.1 (Kilted), which the tests run. None where it does not.
    """
    overrides = getattr(node, '_parameter_overrides', None)
    if not isinstance(overrides, dict):
        return None
    return {name: getattr(param, 'value', None) for name, param in overrides.items()}


def declare_all(node: Any) -> dict[str, Any]:
    """Declare every parameter on ``node`` and return their values.

    Names given to the node that it does not know are refused first (:func:`check_names`).
    ``model.preset`` is declared first; its value picks the other ``model.*`` defaults.

    Args:
        node: the ``rclpy.node.Node`` to declare on.

    Returns:
        ``{name: value}`` for every declared parameter.

    Raises:
        ValueError: an unknown name, a value outside its choices or an invalid engine
            configuration.
        rclpy.exceptions.InvalidParameterValueException: a value outside its range.
    """
    given = given_values(node)
    if given is None:
        node.get_logger().warning('this rclpy does not say which parameters were given: names '
                                  'are not checked (a misspelled one keeps its default)')
    else:
        cameras = given.get('input.cameras')
        check_names(given, cameras if isinstance(cameras, (list, tuple)) else ())
    first = next(s for s in engine_specs() if s.name == 'model.preset')
    preset = node.declare_parameter(first.name, first.default, first.descriptor()).value
    values = {first.name: preset}
    specs = [s for s in all_specs(preset) if s.name != first.name]
    for spec in specs:
        values[spec.name] = input_params.declare_names(node, spec) if spec.default == () \
            else node.declare_parameter(spec.name, spec.default, spec.descriptor()).value
    for spec in [first] + specs:
        reason = check_value(spec, values[spec.name])
        if reason:
            raise ValueError(reason)
    reason = param_checks.check_frames(values) or input_params.check_cameras(values)
    if reason:
        raise ValueError(reason)
    values.update(input_params.declare_mounts(node, values))
    engine_config(values)
    config.MapConfig.from_flat(values)
    config.GridConfig.from_flat(values)
    config.section_from_flat(config.LoopConfig, LOOP_SECTION, values)
    problem = metric_problem(values)
    if problem:
        raise ValueError(problem)
    return values


def check_changes(changes: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Validate a batch of run-time parameter changes against the current values.

    Args:
        changes: ``{name: new value}`` for the parameters being set.
        current: every parameter's current value.

    Returns:
        None when the batch is acceptable, else the reason it is refused.
    """
    specs = {s.name: s for s in all_specs(current.get('model.preset', 'official'))}
    for name, value in changes.items():
        if not name:
            return 'a parameter name may not be empty'
        if name not in specs:
            continue
        reason = check_value(specs[name], value)
        if reason:
            return reason
    merged = {**current, **changes}
    reason = param_checks.check_frames(merged) or input_params.check_cameras(merged)
    if reason:
        return reason
    try:
        engine_config(merged)
        config.MapConfig.from_flat(merged)
    except ValueError as exc:
        return str(exc)
    problem = metric_problem(merged)
    if problem:
        return problem
    wants_depth = merged['publish.depth'] or merged['publish.cloud']
    if wants_depth and not (merged['stream.enable_depth'] and merged['model.enable_depth']):
        return ('publish.depth and publish.cloud need stream.enable_depth (and '
                'model.enable_depth) to be true')
    return None
