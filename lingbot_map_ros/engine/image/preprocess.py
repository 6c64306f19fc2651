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
"""Image preprocessing for the network: the official loader's crop mode (spec §2.1).

Dims: H0 x W0 is the input image, H x W the processed image (W = ``target_width``, H a multiple
of ``patch_size`` and at most ``target_width``).

Steps, bit-exact with the official loader:

1. EXIF orientation applied; an RGBA image is composited onto white; converted to RGB.
2. Resized with PIL ``BICUBIC`` (antialiased when shrinking) to
   ``W = target_width``, ``H_r = round(H0 * W / W0 / patch_size) * patch_size`` (Python ``round``,
   halves to even). The resize is slightly anisotropic because ``H_r`` is snapped.
3. ``uint8 / 255`` as float32, channels first: ``[3, H_r, W]`` in [0, 1].
4. When ``H_r > W``, rows ``[(H_r - W) // 2, + W)`` are kept: portrait images become square.
   Past ``H_r > 4 W`` only those rows are resized (PIL's ``box``), so a 1 x 4096 image costs
   what a 518 x 518 one does; the pixels then differ from resize-then-crop by a few levels.

Special: OpenCV ``INTER_CUBIC`` and ``torch`` bicubic are not bit-equivalent to PIL's filter, so
every entry point goes through PIL. ImageNet normalisation is *not* done here; the model does it.
:class:`PreprocessInfo` keeps what is needed to map the processed camera back to the input image
(``geometry.intrinsics_for_original``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lingbot_map_ros.engine.errors import InvalidFrameError
import numpy as np
from PIL import Image, ImageOps
import torch

# Above this many target widths of resized height (a portrait aspect beyond 4:1, not a camera),
# only the kept rows are resized. PIL's box resize is not bit-identical to resize-then-crop
# (its filter centres round differently), so normal images keep the exact path.
_EXACT_RESIZE_MAX_ROWS = 4


@dataclass(frozen=True, slots=True)
class PreprocessInfo:
    """How a processed image relates to its input image.

    The processed pixel ``(u, v)`` (pixel-centre indices) sits at the input position
    ``((u + 0.5) / scale_x - 0.5, (v + crop_top + 0.5) / scale_y - 0.5)``.
    """

    original_size_hw: tuple[int, int]
    """(H0, W0) of the input image, after the EXIF transpose."""
    resized_size_hw: tuple[int, int]
    """(H_r, W) after the resize, before the crop."""
    image_size_hw: tuple[int, int]
    """(H, W) of the processed image the network sees."""
    crop_top: int
    """Rows removed from the top of the resized image (0 unless H_r > W)."""

    @property
    def scale_x(self) -> float:
        """Horizontal resize factor W / W0."""
        return self.resized_size_hw[1] / self.original_size_hw[1]

    @property
    def scale_y(self) -> float:
        """Vertical resize factor H_r / H0 (differs slightly from ``scale_x``)."""
        return self.resized_size_hw[0] / self.original_size_hw[0]


def resized_height(height: int, width: int, target_width: int = 518,
                   patch_size: int = 14) -> int:
    """Height after the crop-mode resize, before the crop.

    Args:
        height: input height H0 in pixels.
        width: input width W0 in pixels.
        target_width: output width W.
        patch_size: the height is snapped to a multiple of this.

    Returns:
        ``round(H0 * W / W0 / patch_size) * patch_size`` (Python ``round``: halves to even).
    """
    return round(height * target_width / width / patch_size) * patch_size


def preprocess_pil(image: Image.Image, target_width: int = 518,
                   patch_size: int = 14) -> tuple[torch.Tensor, PreprocessInfo]:
    """Preprocess a PIL image (EXIF transpose, alpha on white, RGB, resize, crop).

    Args:
        image: any PIL image; it is not modified.
        target_width: output width W; a positive multiple of ``patch_size``.
        patch_size: patch size of the network.

    Returns:
        ``(image [3, H, W] float32 in [0, 1], info)``.

    Raises:
        ValueError: ``target_width`` or ``patch_size`` is not valid.
        InvalidFrameError: the image is empty or too flat to give one patch row.
    """
    _check_sizes(target_width, patch_size)
    image = ImageOps.exif_transpose(image)
    if image.mode == 'RGBA':
        white = Image.new('RGBA', image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image)
    image = image.convert('RGB')
    width, height = image.size
    if width < 1 or height < 1:
        raise InvalidFrameError(f'empty image: {width}x{height} (W x H)')
    new_h = resized_height(height, width, target_width, patch_size)
    if new_h < patch_size:
        raise InvalidFrameError(
            f'image {width}x{height} (W x H) is too flat: resized to width {target_width} it '
            f'gives height {new_h}, less than one patch row ({patch_size} px)')
    crop_top = (new_h - target_width) // 2 if new_h > target_width else 0
    out_h = min(new_h, target_width)
    if new_h <= _EXACT_RESIZE_MAX_ROWS * target_width:
        # Resize everything, then crop: bit-exact with the official loader.
        image = image.resize((target_width, new_h), Image.Resampling.BICUBIC)
        image = image.crop((0, crop_top, target_width, crop_top + out_h))
    else:
        # Resize only the rows that are kept: PIL reads just the input rows under the filter,
        # so work and memory follow the output, not the (possibly enormous) resized height.
        scale_y = height / new_h
        box = (0.0, crop_top * scale_y, float(width), (crop_top + out_h) * scale_y)
        image = image.resize((target_width, out_h), Image.Resampling.BICUBIC, box=box)
    chw = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)
    chw = chw.to(torch.float32).div(255)
    info = PreprocessInfo(original_size_hw=(height, width), resized_size_hw=(new_h, target_width),
                          image_size_hw=(int(chw.shape[1]), int(chw.shape[2])),
                          crop_top=crop_top)
    return chw.contiguous(), info


def preprocess_path(path: str | Path, target_width: int = 518,
                    patch_size: int = 14) -> tuple[torch.Tensor, PreprocessInfo]:
    """Open an image file with PIL and preprocess it (the official loader, one image).

    Args:
        path: image file (any format PIL reads).
        target_width: output width W; a positive multiple of ``patch_size``.
        patch_size: patch size of the network.

    Returns:
        ``(image [3, H, W] float32 in [0, 1], info)``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``target_width`` or ``patch_size`` is not valid.
        InvalidFrameError: PIL cannot decode the file, or the image is unusable.
    """
    try:
        with Image.open(path) as image:
            image.load()
            return preprocess_pil(image, target_width, patch_size)
    except (Image.UnidentifiedImageError, OSError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise InvalidFrameError(f'cannot decode image file {path}: {err}') from err


def preprocess_array(array: np.ndarray, target_width: int = 518,
                     patch_size: int = 14) -> tuple[torch.Tensor, PreprocessInfo]:
    """Preprocess an image held in a numpy array (what the ROS node and replay have).

    Args:
        array: uint8 ``[H0, W0, 3]`` RGB, ``[H0, W0, 4]`` RGBA (composited on white),
            ``[H0, W0]`` or ``[H0, W0, 1]`` mono (replicated to RGB). Any strides.
        target_width: output width W; a positive multiple of ``patch_size``.
        patch_size: patch size of the network.

    Returns:
        ``(image [3, H, W] float32 in [0, 1], info)``.

    Raises:
        ValueError: ``target_width`` or ``patch_size`` is not valid.
        InvalidFrameError: not a numpy array, wrong dtype, ndim or channel count, empty, or too
            flat to give one patch row.
    """
    if not isinstance(array, np.ndarray):
        raise InvalidFrameError(f'expected a numpy array, got {type(array).__name__}')
    if array.dtype != np.uint8:
        raise InvalidFrameError(f'expected dtype uint8, got {array.dtype} (shape {array.shape})')
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim != 2 and not (array.ndim == 3 and array.shape[2] in (3, 4)):
        raise InvalidFrameError(f'expected an image of shape [H, W], [H, W, 1], [H, W, 3] or '
                                f'[H, W, 4], got {array.shape}')
    if array.shape[0] < 1 or array.shape[1] < 1:
        raise InvalidFrameError(f'empty image: shape {array.shape}')
    # uint8 [H, W] -> 'L', [H, W, 3] -> 'RGB', [H, W, 4] -> 'RGBA'
    image = Image.fromarray(np.ascontiguousarray(array))
    return preprocess_pil(image, target_width, patch_size)


def preprocess_image(image: np.ndarray | str | Path, target_width: int = 518,
                     patch_size: int = 14) -> tuple[torch.Tensor, PreprocessInfo]:
    """:func:`preprocess_path` for a path, :func:`preprocess_array` for an array."""
    if isinstance(image, (str, Path)):
        return preprocess_path(image, target_width, patch_size)
    return preprocess_array(image, target_width, patch_size)


def _check_sizes(target_width: int, patch_size: int) -> None:
    if patch_size < 1:
        raise ValueError(f'patch_size={patch_size} must be >= 1')
    if target_width < patch_size or target_width % patch_size:
        raise ValueError(f'target_width={target_width} must be a positive multiple of '
                         f'patch_size={patch_size}')
