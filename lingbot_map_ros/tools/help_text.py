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
"""Docstrings as ``--help`` text: the Sphinx markup taken out, so a terminal shows plain words."""

from __future__ import annotations

import re

_ROLE = re.compile(r':(?:mod|class|func|meth|data|attr|exc|obj):`(~?)([^`]+)`')
_LITERAL = re.compile(r'``([^`]+)``')


def plain(doc: str | None) -> str:
    """Return ``doc`` with roles (``:mod:`~a.b.c``` -> ``c``) and double backquotes removed.

    A role with ``~`` keeps its last dotted part, as Sphinx shows it; a line break inside a
    role (a long name wrapped) is joined.
    """
    if not doc:
        return ''

    def role(match: re.Match) -> str:
        target = re.sub(r'\s+', '', match.group(2))
        return target.rsplit('.', 1)[-1] if match.group(1) else target

    return _LITERAL.sub(r'\1', _ROLE.sub(role, doc))
