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
"""Compressed keyframe images for verification, bounded by bytes (a RAM ring or a folder).

A loop candidate is verified against its image long after it left the model's cache, so the
keyframes' processed RGB images are kept as JPEG (about 20-60 KB at 518 x 392, quality 90). The
store holds at most ``max_bytes``: the oldest images go first (a ring), so the earliest
places become unverifiable once the bound is reached. With ``folder`` the JPEGs are files
there (``<index>.jpg``, the same bound, deleted oldest first) and RAM holds only their sizes.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np

try:
    import cv2
except ImportError:  # pragma: no cover - depends on the machine
    cv2 = None


def network_rgb(image: Any) -> np.ndarray:
    """Turn a network input ``[3, H, W]`` float tensor in [0, 1] into uint8 ``[H, W, 3]``."""
    pixels = image.detach().float().clamp(0, 1).mul(255).round()
    return pixels.to('cpu').byte().permute(1, 2, 0).contiguous().numpy()


def encode_jpeg(rgb: np.ndarray, quality: int = 90) -> bytes:
    """RGB uint8 ``[H, W, 3]`` -> JPEG bytes (OpenCV, else PIL).

    Raises:
        ValueError: not a uint8 [H, W, 3] image, or a quality outside 1..100.
    """
    image = np.asarray(rgb)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f'need a uint8 [H, W, 3] image, got {image.dtype} {image.shape}')
    if not 1 <= quality <= 100:
        raise ValueError(f'quality={quality} must be in 1..100')
    if cv2 is not None:
        ok, data = cv2.imencode('.jpg', image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
        if ok:
            return data.tobytes()
    import io

    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(image).save(out, format='JPEG', quality=quality)
    return out.getvalue()


def decode_jpeg(data: bytes) -> np.ndarray:
    """JPEG bytes -> RGB uint8 ``[H, W, 3]``.

    Raises:
        ValueError: the bytes are not a decodable image.
    """
    if cv2 is not None:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise ValueError('not a decodable JPEG')
        return image[..., ::-1].copy()
    import io

    from PIL import Image, UnidentifiedImageError
    try:
        return np.asarray(Image.open(io.BytesIO(data)).convert('RGB'))
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f'not a decodable JPEG ({exc})') from exc


class ImageStore:
    """Keyframe JPEGs by keyframe number, oldest dropped beyond ``max_bytes``."""

    def __init__(self, max_bytes: int, folder: str | Path | None = None) -> None:
        """Start empty.

        Args:
            max_bytes: bound of the stored JPEG bytes (>= 0; 0 stores nothing).
            folder: keep the JPEGs as files there (created) instead of in RAM.

        Raises:
            ValueError: a negative bound, or a folder that cannot be created (the node refuses
                such a ``loop.image_folder`` at start already: ``param_checks.py``).
        """
        if max_bytes < 0:
            raise ValueError(f'max_bytes={max_bytes} must be >= 0')
        self._max_bytes = int(max_bytes)
        self._folder = Path(folder) if folder else None
        if self._folder is not None:
            try:
                self._folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ValueError(f'loop.image_folder {str(self._folder)[:200]!r} cannot hold the '
                                 f'keyframe images: {exc.strerror}') from exc
        self._sizes: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._data: dict[int, bytes] = {}
        self._num_bytes = 0
        self.num_evicted = 0
        """Images dropped to stay within the bound (or too large to store)."""

    @property
    def num_bytes(self) -> int:
        """Bytes of the stored JPEGs."""
        return self._num_bytes

    def __len__(self) -> int:
        """Return the number of stored images."""
        return len(self._sizes)

    def __contains__(self, index: int) -> bool:
        """Return True when keyframe ``index``'s image is stored."""
        return index in self._sizes

    def put(self, index: int, jpeg: bytes) -> bool:
        """Store keyframe ``index``'s JPEG, dropping the oldest images beyond the bound.

        Returns:
            False when the image alone exceeds the bound (not stored, counted).
        """
        if index in self._sizes:
            self._remove(index)
        if len(jpeg) > self._max_bytes:
            self.num_evicted += 1
            return False
        while self._num_bytes + len(jpeg) > self._max_bytes:
            self._remove(next(iter(self._sizes)))
            self.num_evicted += 1
        if self._folder is not None:
            (self._folder / f'{index}.jpg').write_bytes(jpeg)
        else:
            self._data[index] = bytes(jpeg)
        self._sizes[index] = len(jpeg)
        self._num_bytes += len(jpeg)
        return True

    def get(self, index: int) -> bytes | None:
        """Keyframe ``index``'s JPEG, or None when it is not (or no longer) stored."""
        if index not in self._sizes:
            return None
        if self._folder is not None:
            try:
                return (self._folder / f'{index}.jpg').read_bytes()
            except OSError:
                return None
        return self._data[index]

    def clear(self) -> None:
        """Drop every image (and its file)."""
        for index in list(self._sizes):
            self._remove(index)

    def _remove(self, index: int) -> None:
        self._num_bytes -= self._sizes.pop(index)
        if self._folder is not None:
            (self._folder / f'{index}.jpg').unlink(missing_ok=True)
        else:
            del self._data[index]
