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
"""Read and check the structure of a JPEG or PNG payload without decoding its pixels.

:func:`inspect_compressed` reads the image size, bit depth and channel count from the PNG
``IHDR`` chunk or the JPEG ``SOFn`` segment, and walks the whole container: every PNG chunk's
CRC, every JPEG segment length and, inside JPEG scans, every ``0xFF`` byte (which must be a
stuffed ``FF 00``, a restart marker in sequence, or a marker that may follow a scan). This costs
one pass over the compressed bytes and no pixel memory, so the caller can refuse a
decompression bomb, a payload that is not what ``format`` says, or a corrupt file before the
decoder allocates anything.

A JPEG corrupted inside its entropy-coded data without touching any ``0xFF`` byte keeps a valid
structure; only the decoder notices (see :mod:`~lingbot_map_ros.ros.messages.jpeg_warnings`).
"""

from __future__ import annotations

from dataclasses import dataclass
import struct
import zlib

import numpy as np

JPEG_SOI = b'\xff\xd8'
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'

# PNG colour type -> channels.
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}
# JPEG start-of-frame markers (SOF0-SOF15 minus DHT 0xC4, JPG 0xC8, DAC 0xCC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_RST = range(0xD0, 0xD8)
_JPEG_EOI, _JPEG_SOS, _JPEG_DRI = 0xD9, 0xDA, 0xDD


class CorruptPayload(ValueError):
    """The payload's container structure is broken.

    Attributes:
        reason: ``truncated`` (ends early) or ``decode`` (damaged).
    """

    def __init__(self, reason: str, message: str) -> None:
        """Store the drop reason next to the message."""
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CompressedHeader:
    """What the header says about the decoded image."""

    kind: str
    """``jpeg`` or ``png``."""
    width: int
    height: int
    channels: int
    bit_depth: int
    """Bits per sample: 8 (or 12 for JPEG, 1-16 for PNG)."""

    @property
    def decoded_bytes(self) -> int:
        """Bytes of the decoded image at its native depth."""
        return self.width * self.height * self.channels * max(1, self.bit_depth // 8)


def sniff_kind(head: bytes) -> str | None:
    """Return ``jpeg`` or ``png`` from the first bytes of a payload, else None."""
    if head.startswith(PNG_SIGNATURE):
        return 'png'
    if head.startswith(JPEG_SOI + b'\xff'):
        return 'jpeg'
    return None


def inspect_compressed(data: np.ndarray | bytes, header_only: bool = False) -> CompressedHeader:
    """Read the header of a JPEG or PNG payload and check its whole structure.

    Args:
        data: the payload.
        header_only: stop at the frame header (``IHDR`` / ``SOFn``): a cheap first look, so
            that limits can be checked before the walk over the whole payload.

    Returns:
        The header.

    Raises:
        CorruptPayload: not JPEG or PNG, cut off, or structurally damaged.
    """
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    kind = sniff_kind(raw[:8])
    if kind == 'png':
        return _inspect_png(raw, header_only)
    if kind == 'jpeg':
        return _inspect_jpeg(raw, header_only)
    raise CorruptPayload('decode', f'payload is neither JPEG nor PNG (starts {raw[:4].hex()})')


def _inspect_png(raw: bytes, header_only: bool) -> CompressedHeader:
    if b'IEND' not in raw[-32:]:  # the common case (a cut-off transfer), named as such
        raise CorruptPayload('truncated', f'PNG of {len(raw)} bytes has no IEND chunk')
    pos, header, end_seen = len(PNG_SIGNATURE), None, False
    while pos < len(raw) and not end_seen:
        if pos + 12 > len(raw):
            raise CorruptPayload('truncated', f'PNG chunk header cut off at byte {pos}')
        length, ctype = struct.unpack('>I4s', raw[pos:pos + 8])
        stop = pos + 12 + length
        if stop > len(raw):
            raise CorruptPayload('truncated', f'PNG chunk {ctype!r} of {length} bytes cut off')
        crc = struct.unpack('>I', raw[stop - 4:stop])[0]
        if zlib.crc32(raw[pos + 4:stop - 4]) != crc:
            raise CorruptPayload('decode', f'PNG chunk {ctype!r} at byte {pos} has a bad CRC')
        if header is None:
            if ctype != b'IHDR' or length != 13:
                raise CorruptPayload('decode', 'PNG does not start with an IHDR chunk')
            width, height, depth, colour = struct.unpack('>IIBB', raw[pos + 8:pos + 18])
            if colour not in _PNG_CHANNELS:
                raise CorruptPayload('decode', f'PNG colour type {colour} is not valid')
            header = CompressedHeader('png', width, height, _PNG_CHANNELS[colour], depth)
            if header_only:
                return header
        end_seen = ctype == b'IEND'
        pos = stop
    if not end_seen:
        raise CorruptPayload('truncated', f'PNG of {len(raw)} bytes has no IEND chunk')
    return header


def _inspect_jpeg(raw: bytes, header_only: bool) -> CompressedHeader:
    pos, header, size = 2, None, len(raw)
    while True:
        pos = _skip_fill(raw, pos)
        if pos + 2 > size:
            raise CorruptPayload('truncated', f'JPEG of {size} bytes has no end-of-image marker')
        marker = raw[pos + 1]
        if marker == _JPEG_EOI:
            break
        if marker == 0xD8:
            raise CorruptPayload('decode', f'JPEG: a second start-of-image marker at byte {pos} '
                                 '(two frames spliced together)')
        if marker in _JPEG_RST or marker == 0x01:
            pos += 2
            continue
        if pos + 4 > size:
            raise CorruptPayload('truncated', f'JPEG segment header cut off at byte {pos}')
        length = struct.unpack('>H', raw[pos + 2:pos + 4])[0]
        if length < 2 or pos + 2 + length > size:
            raise CorruptPayload('truncated', f'JPEG segment 0x{marker:02X} of {length} bytes '
                                 f'at byte {pos} runs past the end')
        if marker in _JPEG_SOF and header is None:
            depth, height, width, comps = struct.unpack('>BHHB', raw[pos + 4:pos + 10])
            header = CompressedHeader('jpeg', width, height, comps, depth)
            if header_only:
                return header
        pos += 2 + length
        if marker == _JPEG_SOS:
            if header is None:
                raise CorruptPayload('decode', 'JPEG scan before any frame header')
            pos = _skip_scan(raw, pos)
    if header is None:
        raise CorruptPayload('decode', 'JPEG has no frame header (SOF)')
    return header


def _skip_fill(raw: bytes, pos: int) -> int:
    """Return the position of the next marker's 0xFF, refusing bytes that are not a marker."""
    if pos < len(raw) and raw[pos] != 0xFF:
        raise CorruptPayload('decode', f'JPEG: byte 0x{raw[pos]:02X} at {pos} where a marker '
                             'was expected')
    while pos + 1 < len(raw) and raw[pos + 1] == 0xFF:  # fill bytes before a marker
        pos += 1
    return pos


def _skip_scan(raw: bytes, pos: int) -> int:
    """Walk entropy-coded data; return the position of the marker that ends the scan."""
    expected_rst = 0
    while True:
        pos = raw.find(b'\xff', pos)
        if pos < 0 or pos + 1 >= len(raw):
            raise CorruptPayload('truncated', f'JPEG scan data runs to the end of the '
                                 f'{len(raw)} bytes without an end-of-image marker')
        nxt = raw[pos + 1]
        if nxt == 0x00 or nxt == 0xFF:
            pos += 1 if nxt == 0xFF else 2
            continue
        if nxt in _JPEG_RST:
            if nxt - 0xD0 != expected_rst:
                raise CorruptPayload('decode', f'JPEG restart marker RST{nxt - 0xD0} at byte '
                                     f'{pos} out of sequence (expected RST{expected_rst})')
            expected_rst = (expected_rst + 1) % 8
            pos += 2
            continue
        if nxt < 0xC0:
            raise CorruptPayload('decode', f'JPEG scan data damaged: invalid marker 0xFF{nxt:02X} '
                                 f'at byte {pos}')
        return pos
