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
"""Crop-mode preprocessing against the official loader's golden tensors (golden README §3).

Run: ``python -m pytest test/engine/test_preprocess.py``; the golden set comes from
``../shared/golden/preprocess`` (``test/conftest.py``), skipped when absent.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from lingbot_map_ros.engine.errors import InvalidFrameError
from lingbot_map_ros.engine.image.preprocess import (preprocess_array, preprocess_path,
                                                     preprocess_pil, resized_height)
import numpy as np
from PIL import Image
import pytest
from safetensors.torch import load_file
import torch


@pytest.fixture(scope='module')
def reference(shared_file) -> dict[str, torch.Tensor]:
    return load_file(shared_file('golden', 'preprocess', 'preprocess.safetensors'))


def test_png_sha256(preprocess_entry: dict, shared_file) -> None:
    entry = preprocess_entry
    digest = hashlib.sha256(shared_file('golden', entry['file']).read_bytes()).hexdigest()
    assert digest == entry['png_sha256']


def test_path_matches_golden_bit_exactly(preprocess_entry: dict, reference: dict,
                                         shared_file) -> None:
    # Exact on any CPU: PIL resamples 8-bit images in fixed-point integer arithmetic and
    # the / 255 is one correctly rounded division; the other exact checks here rely on it too.
    entry = preprocess_entry
    image, info = preprocess_path(shared_file('golden', entry['file']))
    expected = reference[entry['tensor']]
    assert list(image.shape) == entry['output_chw']
    assert image.dtype == torch.float32
    assert torch.equal(image, expected)
    width, height = entry['input_wh']
    assert info.original_size_hw == (height, width)
    assert info.image_size_hw == tuple(entry['output_chw'][1:])


def test_array_and_mono_paths(preprocess_entry: dict, reference: dict, shared_file) -> None:
    with Image.open(shared_file('golden', preprocess_entry['file'])) as pil:
        rgb = np.asarray(pil.convert('RGB'))
    # A non-contiguous view must give the same tensor as the file.
    flipped_twice = rgb[:, ::-1][:, ::-1]
    image, _ = preprocess_array(flipped_twice)
    assert torch.equal(image, reference[preprocess_entry['tensor']])
    mono = rgb[:, :, 1].copy()
    expected_mono, _ = preprocess_pil(Image.fromarray(np.stack([mono] * 3, axis=-1)))
    for array in (mono, mono[:, :, None]):
        image, _ = preprocess_array(array)
        assert torch.equal(image, expected_mono)
        assert torch.equal(image[0], image[2])


def test_portrait_crop_info() -> None:
    # 480x640 portrait: resized to 518 x round(640*518/480/14)*14 = 686 rows, rows 84..601 kept.
    array = (np.arange(640 * 480 * 3) % 251).astype(np.uint8).reshape(640, 480, 3)
    image, info = preprocess_array(array)
    assert image.shape == (3, 518, 518)
    assert info.resized_size_hw == (686, 518)
    assert info.crop_top == 84
    assert info.scale_x == pytest.approx(518 / 480)
    assert info.scale_y == pytest.approx(686 / 640)
    full = np.asarray(Image.fromarray(array).resize((518, 686), Image.Resampling.BICUBIC))
    expected = torch.from_numpy(full[84:602].copy()).permute(2, 0, 1).float() / 255
    assert torch.equal(image, expected)


def test_resized_height_rounds_half_to_even() -> None:
    # h*518/w/14 = 2.5 -> 2 and 3.5 -> 4 under Python round.
    assert resized_height(35, 518) == 28
    assert resized_height(49, 518) == 56
    assert resized_height(720, 1280) == 294
    assert resized_height(480, 640) == 392


def test_rgba_is_composited_on_white() -> None:
    rgba = np.zeros((60, 80, 4), dtype=np.uint8)
    rgba[..., 0] = 200
    rgba[:, :40, 3] = 255  # left half opaque red-ish, right half fully transparent
    image, _ = preprocess_array(rgba, target_width=42)
    assert image.shape == (3, 28, 42)
    # Far right columns are pure white, far left opaque (200, 0, 0).
    assert torch.equal(image[:, :, -3:], torch.ones(3, 28, 3))
    assert torch.allclose(image[:, :, :3], torch.tensor([200 / 255, 0.0, 0.0])[:, None, None]
                          .expand(3, 28, 3))
    # Same through an encoded PNG file.
    buf = io.BytesIO()
    Image.fromarray(rgba).save(buf, format='PNG')
    buf.seek(0)
    with Image.open(buf) as pil:
        from_file, _ = preprocess_pil(pil, target_width=42)
    assert torch.equal(from_file, image)


@pytest.mark.parametrize('array, match', [
    (np.zeros((0, 10, 3), np.uint8), 'empty'),
    (np.zeros((10, 0), np.uint8), 'empty'),
    (np.zeros((10, 10, 3), np.float32), 'uint8'),
    (np.zeros((10, 10, 3), np.uint16), 'uint8'),
    (np.zeros((10, 10, 2), np.uint8), 'shape'),
    (np.zeros((2, 10, 10, 3), np.uint8), 'shape'),
    (np.zeros((10,), np.uint8), 'shape'),
    (np.zeros((2, 1000, 3), np.uint8), 'patch row'),
])
def test_bad_arrays_raise(array: np.ndarray, match: str) -> None:
    with pytest.raises(InvalidFrameError, match=match):
        preprocess_array(array)


def test_bad_inputs_raise(tmp_path: Path) -> None:
    with pytest.raises(InvalidFrameError, match='numpy'):
        preprocess_array([[0, 1], [2, 3]])  # type: ignore[arg-type]
    bad = tmp_path / 'not_an_image.png'
    bad.write_bytes(b'this is not a png')
    with pytest.raises(InvalidFrameError, match='decode'):
        preprocess_path(bad)
    with pytest.raises(FileNotFoundError):
        preprocess_path(tmp_path / 'missing.png')
    with pytest.raises(ValueError, match='target_width'):
        preprocess_array(np.zeros((10, 10, 3), np.uint8), target_width=500)
