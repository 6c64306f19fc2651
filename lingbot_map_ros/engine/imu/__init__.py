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
"""IMU support: preintegration, visual-inertial alignment, gravity, the reading buffer (numpy).

The pure contract is :func:`align_visual_inertial` (docs/imu.md): metric scale, gravity and the
gyroscope bias of a window of the model's keyframes against the IMU readings between them.
"""

from lingbot_map_ros.engine.imu.alignment import (  # noqa: F401 - the package's API
    align, align_visual_inertial, Alignment, AlignmentOptions, STANDARD_GRAVITY)
from lingbot_map_ros.engine.imu.gravity import (  # noqa: F401 - the package's API
    aligned_from_world, still_gravity, StillGravity)
from lingbot_map_ros.engine.imu.preintegration import (  # noqa: F401 - the package's API
    preintegrate, Preintegrated)
from lingbot_map_ros.engine.imu.samples import DROP_REASONS, ImuBuffer  # noqa: F401
from lingbot_map_ros.engine.imu.scale_tracker import (  # noqa: F401 - the package's API
    ImuScaleTracker, ImuStats, scale_disagreement, TrackerConfig)
