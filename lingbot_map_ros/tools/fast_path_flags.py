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
