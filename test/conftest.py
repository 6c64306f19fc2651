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
"""Where the tests find the shared data: ``../shared`` beside the repository, in one place.

``shared/`` (model spec, golden sets, real frames) is not part of the repository; a checkout
without it skips the tests that need it instead of failing them.

- ``shared_file('golden', 'stream_A.json')`` (fixture): the path, or a skip when it is missing;
- ``preprocess_entry`` (parameter): one image of the preprocessing golden set's manifest.
"""

from __future__ import annotations

from collections.abc import Callable
import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / 'shared'
_PREPROCESS_MANIFEST = SHARED / 'golden' / 'preprocess' / 'preprocess.json'


def _find(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f'{path} not found (shared/ must sit beside the repository)')
    return path


@pytest.fixture(scope='session')
def shared_file() -> Callable[..., Path]:
    """Return ``find(*parts) -> Path`` under ``../shared``; a missing path skips the test."""
    return _find


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``preprocess_entry`` with the preprocessing golden set's images."""
    if 'preprocess_entry' not in metafunc.fixturenames:
        return
    entries = []
    if _PREPROCESS_MANIFEST.is_file():
        entries = json.loads(_PREPROCESS_MANIFEST.read_text(encoding='utf-8'))['images']
    metafunc.parametrize('preprocess_entry', entries, ids=[e['tensor'] for e in entries])
