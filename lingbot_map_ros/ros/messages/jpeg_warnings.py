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
"""Decode a JPEG with OpenCV and collect libjpeg's corruption warnings.

libjpeg reports damaged entropy-coded data ("Corrupt JPEG data: premature end of data segment",
"... extraneous bytes before marker", "Premature end of JPEG file") only as a warning printed
with ``fprintf(stderr)``, then returns an image with wrong or grey blocks; neither OpenCV nor
PIL passes the warning on. :func:`imdecode_jpeg` therefore points file descriptor 2 at a
scratch file for the duration of the decode, reads what libjpeg wrote, and writes every other
line back to the real stderr, so no log line of another thread is lost (only delayed by the
decode, a few milliseconds). A lock serialises decodes, which share the descriptor.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading

import cv2
import numpy as np

# libjpeg(-turbo) messages that mean the pixels are not what was encoded.
_CORRUPTION_MARKERS = ('Corrupt JPEG data', 'Premature end of JPEG file')

_LOCK = threading.Lock()
_scratch: tempfile.TemporaryFile | None = None


def imdecode_jpeg(buf: np.ndarray, flags: int) -> tuple[np.ndarray | None, list[str]]:
    """Decode a JPEG payload; return the image (None when OpenCV fails) and libjpeg warnings.

    Args:
        buf: the payload as a flat uint8 array.
        flags: ``cv2.IMREAD_*`` flags.

    Returns:
        ``(image or None, corruption warnings)``; an empty list means libjpeg saw no damage.
    """
    global _scratch
    with _LOCK:
        if _scratch is None:
            _scratch = tempfile.TemporaryFile(prefix='lingbot_map_jpeg_')
        scratch = _scratch
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(scratch.fileno(), 2)
            try:
                decoded = cv2.imdecode(buf, flags)
            finally:
                os.dup2(saved, 2)
        finally:
            os.close(saved)
        scratch.seek(0)
        text = scratch.read().decode('utf-8', 'replace')
        scratch.seek(0)
        scratch.truncate()
    warnings, others = [], []
    for line in text.splitlines(keepends=True):
        (warnings if line.startswith(_CORRUPTION_MARKERS) else others).append(line)
    if others:
        sys.stderr.write(''.join(others))
    return decoded, [w.strip() for w in warnings]
