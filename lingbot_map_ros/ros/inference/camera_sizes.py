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
"""Several cameras, one engine: the primary camera's processed image size is the engine's.

The cameras' sessions are streams of one engine, whose KV page pool holds frames of one
processed size (``stream.image_width`` wide, the height from the image's aspect ratio). Which
size that is cannot be known at start (it follows the incoming images), so the rule is:

- The primary camera's processed size is the engine's. A side camera's frame of another size is
  refused: a ``resolution_mismatch`` drop of that camera, one warning per camera and size.
- A side camera may send first and start the engine at its size; when the primary's first
  frame (or a frame of a new primary size) comes at another size, the side cameras of the old
  size are reset (counted on them) so that the primary is never locked out.

Pure Python, no ROS: :class:`CameraSizes` decides, the camera group acts.
"""

from __future__ import annotations

import dataclasses

from lingbot_map_ros.engine.image.preprocess import resized_height


def processed_size(shape_hw: tuple[int, int], image_width: int, patch_size: int
                   ) -> tuple[int, int] | None:
    """Return the processed (H, W) of an input image (crop mode), None when it is too flat."""
    height = resized_height(int(shape_hw[0]), int(shape_hw[1]), image_width, patch_size)
    if height < patch_size:
        return None  # the engine refuses it (invalid_frame)
    return min(height, image_width), image_width


@dataclasses.dataclass(frozen=True)
class SizeVerdict:
    """What one frame's size means for the group."""

    accepted: bool
    """False: drop the frame (``resolution_mismatch``)."""
    reset: tuple[str, ...] = ()
    """Side cameras to reset first (they hold the engine at another size)."""
    detail: str = ''
    """Why the frame is refused ('' when accepted)."""
    warn: bool = False
    """The first refusal of this camera at this size: log a warning (later ones are counted)."""


class CameraSizes:
    """The engine's size (the primary's) and each side camera's last size."""

    def __init__(self, primary: str, image_width: int, patch_size: int) -> None:
        """Start with no size known."""
        self.primary = primary
        self._width = int(image_width)
        self._patch = int(patch_size)
        self.engine_hw: tuple[int, int] | None = None
        """The primary's processed (H, W) once its first frame came."""
        self._started: dict[str, tuple[int, int]] = {}
        self._warned: set[tuple[str, tuple[int, int]]] = set()

    def check(self, name: str, shape_hw: tuple[int, int]) -> SizeVerdict:
        """Judge camera ``name``'s input image of ``shape_hw`` (H, W) before it is fed."""
        size = processed_size(shape_hw, self._width, self._patch)
        if size is None:
            return SizeVerdict(True)
        if name == self.primary:
            if size == self.engine_hw:
                return SizeVerdict(True)
            self.engine_hw = size
            stale = tuple(n for n, s in self._started.items() if s != size)
            for other in stale:
                del self._started[other]
            return SizeVerdict(True, reset=stale)
        if self.engine_hw is None or size == self.engine_hw:
            self._started[name] = size
            return SizeVerdict(True)
        key = (name, size)
        warn = key not in self._warned
        self._warned.add(key)
        return SizeVerdict(False, detail=(
            f'camera {name}: processed size {size[1]}x{size[0]} (W x H) is not the primary '
            f"camera '{self.primary}''s {self.engine_hw[1]}x{self.engine_hw[0]}; one engine "
            'serves one image size (send images of the same aspect ratio)'), warn=warn)

    def forget(self, name: str) -> None:
        """Camera ``name``'s session was reset: it holds no pages of the engine any more."""
        self._started.pop(name, None)
