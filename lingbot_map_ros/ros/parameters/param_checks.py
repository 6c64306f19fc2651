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
"""Value checks of the node's parameters beyond rclpy's types and ranges (docs/parameters.md).

Every numeric value must be finite and inside its announced range; arrays may not be empty and
hold only finite values in their element range; ``frames.base_to_camera`` must be a plausible
mounting (:func:`~lingbot_map_ros.ros.parameters.mounting.pose7_to_matrix`);
``frames.odom_frame`` and ``frames.base_frame`` may not be empty and no two of odom, base and map
frame may be equal; ``output.directory`` must resolve to an absolute path
(:func:`~lingbot_map_ros.ros.parameters.save_directory.resolve_directory`); a non-empty
``loop.image_folder`` must resolve alike and be a folder this process can write in, or one it
can create (:func:`check_image_folder`). Each check returns the reason a value is refused,
naming the parameter, or None.

:func:`check_pool` refuses, at start, a page pool (``cache.pool_pages``, ``cache.streams``) that
cannot pose every camera, or whose bytes exceed the device's memory: a pool too small for a
stream's lease raised at the warm-up (or, at another image size, reset every frame), and a huge
one allocated until the process was killed. :func:`pool_surplus` says, for a warning at start,
what a pool sized for more streams than the node opens costs (64 streams with one camera:
gigabytes nothing uses).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from typing import Any

from lingbot_map_ros.config import EngineConfig
from lingbot_map_ros.engine.cache.capacity import pool_pages
from lingbot_map_ros.engine.cache.stream_kv import prep_pages, stream_pages
from lingbot_map_ros.engine.frames import NUM_SPECIAL_TOKENS
from lingbot_map_ros.engine.image.preprocess import resized_height
from lingbot_map_ros.ros.parameters.mounting import pose7_to_matrix
from lingbot_map_ros.ros.parameters.save_directory import resolve_directory

ARRAY_ELEMENT_RANGES: dict[str, tuple[int, int]] = {
    'model.tap_layers': (0, 127),
    'model.depth_out_channels': (1, 8192),
}
"""Bounds of the elements of integer arrays (the dataclasses check the arrays' shapes)."""
FRAME_PARAMS = ('frames.odom_frame', 'frames.base_frame', 'frames.map_frame',
                'frames.camera_frame')
REQUIRED_FRAMES = ('frames.odom_frame', 'frames.base_frame')
DISTINCT_FRAMES = ('frames.odom_frame', 'frames.base_frame', 'frames.map_frame')
IMAGE_FOLDER = 'loop.image_folder'


def check_value(name: str, value: Any, bounds: tuple[float, float] | None) -> str | None:
    """Return why ``value`` is refused for parameter ``name``, or None.

    Args:
        name: the parameter.
        value: proposed value.
        bounds: inclusive range of a numeric parameter, or None.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            return f'{name}={value} is not a finite number'
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            return f'{name}={value} is outside [{bounds[0]:g}, {bounds[1]:g}]'
        return None
    if isinstance(value, (list, tuple)):
        return _check_array(name, value)
    if name in REQUIRED_FRAMES and not str(value).strip():
        return f'{name} may not be empty'
    if name in FRAME_PARAMS and value != str(value).strip():
        return f'{name}={value!r} has leading or trailing white space'
    if name == 'output.directory':
        try:
            return _check_path_length(resolve_directory(str(value)))
        except ValueError as exc:
            return str(exc)
    if name == IMAGE_FOLDER and str(value):
        return check_image_folder(str(value))
    return None


def check_image_folder(text: str) -> str | None:
    """Return why ``loop.image_folder`` cannot hold the keyframe JPEGs, or None.

    The value resolves as ``output.directory`` does (``~``, ``$VARS``; an unset one is refused).
    An existing path must be a folder this process can create a file in; a missing one must
    have, as its nearest existing parent, such a folder (the store creates the rest). The
    check creates nothing that stays: its probe is an unnamed temporary file.

    Args:
        text: the parameter's value (not empty: empty keeps the JPEGs in RAM).
    """
    try:
        folder = resolve_directory(text, IMAGE_FOLDER)
    except ValueError as exc:
        return str(exc)
    shown = repr(text) if len(text) <= 200 else repr(text[:200]) + '...'
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = 'is' if existing == folder else f'is inside {str(existing)!r}, which is'
        return (f'{IMAGE_FOLDER}={shown} {what} not a folder: the keyframe images cannot be '
                "stored (set another folder, or '' to keep them in RAM)")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        where = '' if existing == folder else f' (in {str(existing)!r}, to create it)'
        return (f'{IMAGE_FOLDER}={shown}: cannot write a file there{where}: {exc.strerror}; '
                "set a writable folder, or '' to keep the keyframe images in RAM")
    return None


SAVE_NAME_CHARS = 64
"""Room kept in the path for what ``~/save`` adds under ``output.directory`` (its folder and
file names)."""


def _check_path_length(path: Any) -> str | None:
    """Refuse a directory whose path (or one of its names) the file system cannot hold."""
    try:
        path_max = os.pathconf('/', 'PC_PATH_MAX')
        name_max = os.pathconf('/', 'PC_NAME_MAX')
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        path_max, name_max = 4096, 255
    text = str(path)
    if len(os.fsencode(text)) + SAVE_NAME_CHARS > path_max:
        return (f'output.directory is {len(text)} characters long: with the folder ~/save '
                f'adds, it exceeds the {path_max}-byte path limit of the file system')
    longest = max((os.fsencode(part) for part in path.parts), key=len)
    if len(longest) > name_max:
        return (f'output.directory holds a name of {len(longest)} bytes; the file system '
                f'allows {name_max}')
    return None


def _check_array(name: str, value: list[Any] | tuple[Any, ...]) -> str | None:
    if name == 'frames.base_to_camera':
        try:
            pose7_to_matrix(value, source=name)
        except ValueError as exc:
            return str(exc)
        return None
    if not value:
        return f'{name} may not be empty'
    if not all(math.isfinite(v) for v in value):
        return f'{name}={list(value)} holds a non-finite number'
    low, high = ARRAY_ELEMENT_RANGES.get(name, (-math.inf, math.inf))
    if not all(low <= v <= high for v in value):
        return f'{name}={list(value)}: every value must be in [{low}, {high}]'
    return None


def check_frames(values: dict[str, Any]) -> str | None:
    """Refuse equal odom, base and map frame ids (TF cannot hold a frame as its own parent).

    Args:
        values: parameter values (the ``frames.*`` keys are read).

    Returns:
        None when acceptable, else the reason it is refused.
    """
    seen: dict[str, str] = {}
    for key in DISTINCT_FRAMES:
        frame = values.get(key)
        if not frame:
            continue
        if frame in seen:
            return f"{key} and {seen[frame]} are both '{frame}': they must differ"
        seen[frame] = key
    return None


POOL_MEMORY_SHARE = 0.9
"""The pool may take at most this share of the device's memory (the weights need the rest)."""


def reference_size_hw(config: EngineConfig) -> tuple[int, int]:
    """Return the processed (H, W) of a 4:3 image of ``stream.image_width`` (the warm-up's)."""
    width = config.stream.image_width
    patch = config.model.patch_size
    return min(resized_height(width * 3 // 4, width, width, patch), width), width


def pool_need(config: EngineConfig, num_cameras: int) -> tuple[int, int, tuple[int, int]]:
    """Return (pages one camera needs, pages of the configured pool, the reference size).

    One camera's stream leases ``N_s + W + 1`` patch pages and its special pages, and its
    rollover prepares the next session's scale pages beside it; pages hold one frame's patch
    tokens, so flatter images (fewer tokens a frame) need more pages than the 4:3 reference.
    """
    cache = config.cache
    size_hw = reference_size_hw(config)
    page = (size_hw[0] // config.model.patch_size) * (size_hw[1] // config.model.patch_size)
    one = (stream_pages(page, NUM_SPECIAL_TOKENS, cache.scale_frames, cache.sliding_window,
                        cache.max_total_frames)
           + prep_pages(page, NUM_SPECIAL_TOKENS, cache.scale_frames))
    streams = max(cache.streams, num_cameras)
    pages = pool_pages(dataclasses.replace(cache, streams=streams), page)
    return one, pages, size_hw


def pool_bytes(config: EngineConfig, pages: int, size_hw: tuple[int, int]) -> int:
    """Return the bytes of ``pages`` pool pages at processed size ``size_hw`` (K, V, all layers).

    The storage is e4m3 (1 byte) with ``cache.dtype: float8_e4m3fn``, else the cache dtype on
    CUDA and float32 on the CPU.
    """
    model = config.model
    page = (size_hw[0] // model.patch_size) * (size_hw[1] // model.patch_size)
    if config.cache.dtype == 'float8_e4m3fn':
        itemsize = 1
    elif str(config.stream.device).startswith('cuda'):
        itemsize = 2 if config.cache.dtype in ('bfloat16', 'float16') else 4
    else:
        itemsize = 4
    return 2 * model.depth * pages * page * model.num_heads * model.head_dim * itemsize


def device_memory_bytes(device: str) -> int | None:
    """Return the total memory of ``device`` ('cpu', 'cuda', 'cuda:N'), None when unknown."""
    if str(device).startswith('cuda'):
        import torch
        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    try:
        return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def check_pool(config: EngineConfig, num_cameras: int,
               memory_bytes: int | None = None) -> str | None:
    """Return why the page pool cannot pose every camera or does not fit the device, or None.

    Args:
        config: the engine configuration (``cache.streams`` already raised to the cameras).
        num_cameras: streams the node opens (1 with one camera).
        memory_bytes: the device's memory; None: :func:`device_memory_bytes`.
    """
    one, pages, size_hw = pool_need(config, num_cameras)
    cache = config.cache
    where = f'{size_hw[1]}x{size_hw[0]} (W x H, a 4:3 image of stream.image_width)'
    if cache.pool_pages and cache.pool_pages < one * num_cameras:
        return (f'cache.pool_pages={cache.pool_pages} cannot pose '
                f'{num_cameras} camera(s): each needs {one} pages at {where}; set at least '
                f'{one * num_cameras}, or 0 to size the pool from cache.streams')
    memory = device_memory_bytes(config.stream.device) if memory_bytes is None else memory_bytes
    if memory is None:
        return None
    need = pool_bytes(config, pages, size_hw)
    if need > POOL_MEMORY_SHARE * memory:
        name = (f'cache.pool_pages={cache.pool_pages}' if cache.pool_pages
                else f'cache.streams={cache.streams}')
        fits = int(POOL_MEMORY_SHARE * memory // max(1, pool_bytes(config, one, size_hw)))
        return (f'{name} sizes a KV page pool of {pages} pages = {need / 2**30:.1f} GiB at '
                f'{where}, more than {POOL_MEMORY_SHARE:.0%} of the '
                f'{memory / 2**30:.1f} GiB of {config.stream.device}; '
                f'{num_cameras} camera(s) need {one * num_cameras} pages '
                f'({pool_bytes(config, one * num_cameras, size_hw) / 2**30:.2f} GiB); at most '
                f'{fits} streams fit')
    return None


def pool_surplus(config: EngineConfig, num_cameras: int) -> str | None:
    """Return a warning when the pool holds more streams than the node opens, or None.

    The node opens one stream per camera (a rollover's next session and a loop verification
    use the headroom each stream's share already has), so ``cache.streams`` above the number
    of cameras, or ``cache.pool_pages`` above what they need, is memory nothing uses.

    Args:
        config: the engine configuration (``cache.streams`` already raised to the cameras).
        num_cameras: streams the node opens (1 with one camera).
    """
    one, pages, size_hw = pool_need(config, num_cameras)
    cache = config.cache
    if cache.pool_pages:
        used = one * num_cameras
        name = f'cache.pool_pages={cache.pool_pages}'
    else:
        page = (size_hw[0] // config.model.patch_size) * (size_hw[1] // config.model.patch_size)
        used = pool_pages(dataclasses.replace(cache, streams=num_cameras), page)
        name = f'cache.streams={cache.streams}'
    if pages <= used:
        return None
    total, spare = pool_bytes(config, pages, size_hw), pool_bytes(config, pages - used, size_hw)
    return (f'{name} sizes a KV page pool of {pages} pages = {total / 2**30:.2f} GiB at '
            f'{size_hw[1]}x{size_hw[0]} on {config.stream.device}; this node opens '
            f'{num_cameras} stream(s) (one per camera), which use {used} pages: '
            f'{spare / 2**30:.2f} GiB is never used. Set '
            + (f'cache.pool_pages to {used} or 0' if cache.pool_pages
               else f'cache.streams to {num_cameras}'))
