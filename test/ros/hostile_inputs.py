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
"""Hostile images for the robustness tests, and a child-process probe of their cost.

The bombs are real: their compressed streams inflate to the full size their headers announce
(an all-zero image, so the zlib stream is built from one compressed block repeated and its
checksum computed in closed form, in milliseconds instead of deflating gigabytes).

Run ``python test/ros/hostile_inputs.py`` for the table of peak RSS and time per input.
"""

from __future__ import annotations

import json
from pathlib import Path
import struct
import subprocess
import sys
import zlib

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_ADLER_MOD = 65521


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk with its CRC."""
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))


def zero_png(width: int, height: int, depth: int = 8, colour: int = 0) -> bytes:
    """Build a valid PNG of an all-zero image, compressed at deflate's best ratio (~1030:1)."""
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    row_bytes = 1 + width * channels * depth // 8
    total = row_bytes * height
    block_len = 1 << 20
    comp = zlib.compressobj(9)
    piece = comp.compress(b'\0' * block_len) + comp.flush(zlib.Z_FULL_FLUSH)
    header, body = piece[:2], piece[2:]  # after a full flush every block compresses alike
    num_blocks, rest = divmod(total, block_len)
    tail = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail_bytes = tail.compress(b'\0' * rest) + tail.flush()
    # Adler-32 of n zero bytes: a = 1, b = n (mod 65521).
    adler = ((total % _ADLER_MOD) << 16) | 1
    stream = header + body * num_blocks + tail_bytes + struct.pack('>I', adler)
    ihdr = struct.pack('>IIBBBBB', width, height, depth, colour, 0, 0, 0)
    return PNG_SIGNATURE + png_chunk(b'IHDR', ihdr) + png_chunk(b'IDAT', stream) + \
        png_chunk(b'IEND', b'')


# What the probe child runs: build the input, reset the peak RSS, convert, report.
_CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from lingbot_map_ros.engine.image.preprocess import preprocess_array
from lingbot_map_ros.ros.messages import conversions

def rss(key):
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith(key + ':'):
            return int(line.split()[1]) * 1024
    raise RuntimeError(key)

kind, arg = sys.argv[1], sys.argv[2]
class Msg:
    pass
msg = Msg()
if kind == 'raw':
    height, width = map(int, arg.split('x'))
    msg.height, msg.width, msg.encoding, msg.is_bigendian = height, width, 'mono8', 0
    msg.step, msg.data = width, bytes(range(256)) * (height * width // 256 + 1)
else:
    msg.format, msg.data = kind, Path(arg).read_bytes()
try:
    Path('/proc/self/clear_refs').write_text('5')  # VmHWM := VmRSS
except OSError:
    pass  # the peak then also covers the imports: an upper bound
base = rss('VmRSS')
start = time.perf_counter()
try:
    if kind == 'raw':
        rgb = conversions.image_msg_to_rgb(msg)
        out = tuple(preprocess_array(rgb, 518, 14)[0].shape)
    else:
        out = tuple(conversions.compressed_msg_to_rgb(msg).shape)
except conversions.ImageConversionError as exc:
    out = f'refused ({exc.reason}): {exc}'
elapsed = time.perf_counter() - start
print(json.dumps({'peak_over_base_bytes': rss('VmHWM') - base, 'seconds': elapsed,
                  'result': str(out)}))
"""


def probe_cost(kind: str, arg: str, env: dict[str, str] | None = None) -> dict:
    """Convert one input in a child process; return its peak RSS over baseline and time.

    Args:
        kind: 'raw' (``arg`` = 'HxW' of a mono8 image, converted and preprocessed) or a
            CompressedImage ``format`` (``arg`` = the payload file).
        env: environment of the child.

    Returns:
        ``{'peak_over_base_bytes', 'seconds', 'result'}``.
    """
    done = subprocess.run([sys.executable, '-c', _CHILD, kind, arg], capture_output=True,
                          text=True, timeout=300, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Print the cost of every hostile input (for the robustness docs)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        cases = [('raw', '4096x1', 'mono8 1x4096 (W x H)'),
                 ('raw', '16384x1', 'mono8 1x16384')]
        for name, data in (('bomb_rgba16_16384.png', zero_png(16384, 16384, 16, 6)),
                           ('gray_20000.png', zero_png(20000, 20000))):
            path = Path(tmp) / name
            path.write_bytes(data)
            cases.append(('png', str(path), f'{name} ({len(data) / 1e6:.2f} MB)'))
        for kind, arg, label in cases:
            cost = probe_cost(kind, arg)
            print(f'{label}: peak +{cost["peak_over_base_bytes"] / 2**20:.1f} MiB, '
                  f'{cost["seconds"] * 1e3:.1f} ms, {cost["result"][:90]}')


if __name__ == '__main__':
    main()
