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
"""The QoS of the node's services: a request queue deep enough for a burst of callers.

Beside the publishers, which create most of the services (``~/save``, the map reuse ones); the
node's ``~/reset`` (``nodes/node_services.py``) takes it from here too.
"""

from rclpy.qos import HistoryPolicy, qos_profile_services_default, QoSProfile

# Requests held by a service: every caller of a burst is answered (the default depth of 10
# silently dropped the rest).
SERVICE_QUEUE_DEPTH = 1000


def service_qos() -> QoSProfile:
    """Return the services' default QoS with a queue deep enough for a burst of callers."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=SERVICE_QUEUE_DEPTH,
                      reliability=qos_profile_services_default.reliability,
                      durability=qos_profile_services_default.durability)
