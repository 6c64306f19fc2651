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
"""The mapping back end: one owner of loop closure and map reuse (``backend.MappingBackend``).

Sub-folders: ``places`` (place recognition), ``verify`` (a candidate checked by the model),
``graph`` (the pose graph and its gate), ``store`` (the map on disk). The owner and the worker
that drives them stand at this level: ``backend``, ``loop_closer``, ``loop_steps``,
``loop_estimate``, ``loaded_map``.
"""
