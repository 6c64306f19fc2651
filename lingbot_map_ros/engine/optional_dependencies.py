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
"""The loop closure's optional dependencies, imported here and nowhere else.

``gtsam`` (the pose graph) is required for loop closure: :func:`require_gtsam` raises an
``ImportError`` that says how to install it, and :func:`missing` names what is absent so the
node can report loop closure as unavailable instead of failing. ``faiss`` (the place index) is
optional: without it :class:`~lingbot_map_ros.engine.mapping.places.place_index.PlaceIndex`
searches by an exact matrix product.
"""

from __future__ import annotations

import logging
from types import ModuleType

_INSTALL = 'pip install gtsam==4.3.0 faiss-cpu (or the [loop] extra of lingbot_map_ros)'


def require_gtsam() -> ModuleType:
    """Return the ``gtsam`` module.

    Raises:
        ImportError: gtsam is not installed (the message says how to install it).
    """
    try:
        import gtsam
    except ImportError as exc:
        raise ImportError(f'loop closure needs gtsam ({exc}); {_INSTALL}') from exc
    return gtsam


def faiss_or_none() -> ModuleType | None:
    """Return the ``faiss`` module, or None when it is not installed.

    faiss's loader logs at INFO which instruction set it tried and loaded ("Loading faiss with
    AVX512 support", "Could not load library with AVX2 support due to: ..."): noise in every
    tool that logs at INFO. Its logger is held at WARNING for the import only.
    """
    loader = logging.getLogger('faiss.loader')
    level = loader.level
    loader.setLevel(max(level, logging.WARNING))
    try:
        import faiss
    except ImportError:
        return None
    finally:
        loader.setLevel(level)
    return faiss


def missing() -> str | None:
    """Say what loop closure lacks to run (None when gtsam imports)."""
    try:
        require_gtsam()
    except ImportError as exc:
        return str(exc)
    return None
