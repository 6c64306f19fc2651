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
"""The ``--fast-path`` flag of the tools (``stream.fast_path``), with its old boolean aliases."""

from __future__ import annotations

import argparse
import typing

from ..config import FastPath


def add_fast_path_flags(parser: argparse.ArgumentParser, default: FastPath,
                        help_text: str) -> None:
    """Add ``--fast-path MODE`` and the aliases ``--cuda-graphs`` / ``--no-cuda-graphs``.

    ``--cuda-graphs`` means ``whole_frame`` (the backend caps it), ``--no-cuda-graphs`` ``eager``.
    """
    parser.add_argument('--fast-path', choices=typing.get_args(FastPath), default=default,
                        help=help_text)
    parser.add_argument('--cuda-graphs', dest='fast_path', action='store_const',
                        const='whole_frame', help='same as --fast-path whole_frame')
    parser.add_argument('--no-cuda-graphs', dest='fast_path', action='store_const',
                        const='eager', help='same as --fast-path eager')
