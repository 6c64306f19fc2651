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
"""One declared ROS parameter as data: default, description, read-only flag, choices, range.

:class:`ParamSpec` builds the ``ParameterDescriptor`` announced to ``ros2 param describe`` (the
only use of ROS here, imported there, so the tools read the tables without ROS); the tables of
specs live in :mod:`~lingbot_map_ros.ros.parameters.params` (engine, map, metric, node) and
:mod:`~lingbot_map_ros.ros.parameters.input_params` (inputs, cameras, frames).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from rcl_interfaces.msg import ParameterDescriptor

RO, LIVE = True, False
"""``read_only`` values of a spec, named for the tables."""


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter: default, description, limits."""

    name: str
    default: Any
    description: str
    read_only: bool = True
    choices: tuple[str, ...] = ()
    int_range: tuple[int, int, int] | None = None
    """(from, to, step); step 0 means any value in the range."""
    float_range: tuple[float, float] | None = None

    def descriptor(self) -> ParameterDescriptor:
        """Build the ``ParameterDescriptor`` announced to ``ros2 param describe``."""
        from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

        desc = ParameterDescriptor(name=self.name, description=self.description,
                                   read_only=self.read_only)
        desc.type = _param_type(self.default)
        if self.choices:
            desc.additional_constraints = 'one of: ' + ', '.join(self.choices)
        if self.int_range:
            lo, hi, step = self.int_range
            desc.integer_range = [IntegerRange(from_value=lo, to_value=hi, step=step)]
        if self.float_range:
            lo_f, hi_f = self.float_range
            desc.floating_point_range = [FloatingPointRange(from_value=lo_f, to_value=hi_f,
                                                            step=0.0)]
        return desc


def _param_type(value: Any) -> int:
    from rcl_interfaces.msg import ParameterType

    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return ParameterType.PARAMETER_STRING_ARRAY  # names; () is the empty string array
    if isinstance(value, bool):
        return ParameterType.PARAMETER_BOOL
    if isinstance(value, int):
        return ParameterType.PARAMETER_INTEGER
    if isinstance(value, float):
        return ParameterType.PARAMETER_DOUBLE
    if isinstance(value, str):
        return ParameterType.PARAMETER_STRING
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return ParameterType.PARAMETER_INTEGER_ARRAY
    if isinstance(value, (list, tuple)) and all(isinstance(v, float) for v in value):
        return ParameterType.PARAMETER_DOUBLE_ARRAY
    raise TypeError(f'no ROS parameter type for {value!r}')
