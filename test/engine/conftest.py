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
"""Fixtures of the engine tests: the one tiny engine and the one source of random frames.

Each fixture hands out the factory of ``tiny_engine.py`` (settings differ from test to test):

- ``tiny_config(*overrides)``: the tiny CPU ``EngineConfig``, flat overrides laid over it;
- ``tiny_session(*overrides, **kwargs)``: a ``StreamingSession`` of that config on random weights;
- ``random_frames(count, seed, size)``: camera frames, H x W x 3 uint8, from one numpy seed.

Take them as test arguments; never ``from conftest import`` (every conftest of the suite is
imported under the one name ``conftest``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import tiny_engine  # beside this file: pytest puts a conftest's directory on sys.path


@pytest.fixture
def tiny_config() -> Callable[..., object]:
    """Return ``tiny_engine.tiny_config``: ``(*overrides) -> EngineConfig``."""
    return tiny_engine.tiny_config


@pytest.fixture
def tiny_session() -> Callable[..., object]:
    """Return ``tiny_engine.tiny_session``: ``(*overrides, **kwargs) -> StreamingSession``."""
    return tiny_engine.tiny_session


@pytest.fixture
def random_frames() -> Callable[..., list]:
    """Return ``tiny_engine.random_frames``: ``(count, seed=0, size) -> [H x W x 3 uint8]``."""
    return tiny_engine.random_frames
