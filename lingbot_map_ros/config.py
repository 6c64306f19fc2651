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
"""One tree of frozen dataclasses: YAML -> ROS parameters -> engine.

``EngineConfig`` = ``ModelConfig`` (what the network is) + ``CacheConfig`` (how the
global-attention KV cache is sized and which attention backend runs it, with the kernels' tuning
``KernelConfig`` as ``cache.kernel``, in ``kernel_config.py``) + ``StreamConfig`` (how
frames are fed); ``MapConfig`` (the accumulated point-cloud map, in ``map_config.py``),
``MetricConfig`` (metric scale from a depth camera, in ``metric_config.py``) and ``LoopConfig``
(``loop_config.py``) sit beside it, re-exported here.
Each dataclass is the only source of its defaults. The ROS node declares one parameter per field
(``section.field``), the YAML file ``config/lingbot_map.yaml`` carries the same keys, and the tools
load that YAML with :func:`load_yaml`.

The ``ModelConfig`` default is the official LingBot-Map model (ViT-L/14-reg trunk, 24+24 blocks,
4 camera iterations, DPT depth head); ``ModelConfig.from_preset('tiny')`` is a small random-weight
model for CPU tests and demos.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
import typing
from typing import Any, Literal

from lingbot_map_ros.grid_config import GridConfig  # noqa: F401 - re-exported
from lingbot_map_ros.imu_config import ImuConfig  # noqa: F401 - re-exported
from lingbot_map_ros.kernel_config import KernelConfig
from lingbot_map_ros.loop_config import LoopConfig  # noqa: F401 - re-exported
from lingbot_map_ros.map_config import MapConfig
from lingbot_map_ros.metric_config import (  # noqa: F401 - MetricConfig re-exported
    MetricConfig, section_from_flat)
import yaml

Backend = Literal['flashinfer', 'sdpa', 'reference', 'triton', 'fa3', 'auto']
DType = Literal['bfloat16', 'float16', 'float32']
HeadDType = Literal['float32', 'bfloat16']
CacheDType = Literal['bfloat16', 'float16', 'float32', 'float8_e4m3fn']
Precision = Literal['faithful', 'fast_approximate']
FastPath = Literal['eager', 'segments', 'whole_frame']
Preset = Literal['official', 'tiny']


@dataclass(frozen=True)
class ModelConfig:
    """Network shape. Defaults are the official checkpoint's."""

    preset: Preset = 'official'
    """Preset the values came from: 'official' or 'tiny' (see ``ModelConfig.from_preset``)."""
    img_size: int = 518
    """Image size the DINO position table was trained for (37x37 grid + cls). Keep 518."""
    patch_size: int = 14
    """Patch size in pixels."""
    embed_dim: int = 1024
    """Width of the DINO trunk and the aggregator."""
    num_heads: int = 16
    """Attention heads in the trunk and the aggregator (head dim = embed_dim / num_heads = 64)."""
    dino_depth: int = 24
    """Number of DINOv2 trunk blocks."""
    depth: int = 24
    """Number of frame/global block pairs in the aggregator."""
    mlp_ratio: float = 4.0
    """MLP hidden width / embed_dim."""
    num_dino_registers: int = 4
    """DINOv2 register tokens (live only inside the trunk)."""
    max_frame_num: int = 1024
    """Rows of the 3-D RoPE time table: the keyframe-count ceiling of one session."""
    tap_layers: tuple[int, ...] = (4, 11, 17, 23)
    """Aggregator layers whose [frame, global] features feed the heads."""
    camera_num_iterations: int = 4
    """Refinement iterations of the camera head (each has its own KV cache)."""
    camera_trunk_depth: int = 4
    """Transformer blocks in the camera-head trunk."""
    camera_num_heads: int = 16
    """Heads of the camera-head trunk (width 2*embed_dim)."""
    enable_depth: bool = True
    """Build the DPT depth head (its keys are part of the official checkpoint)."""
    depth_features: int = 256
    """DPT fusion width."""
    depth_out_channels: tuple[int, ...] = (256, 512, 1024, 1024)
    """DPT per-level projection widths."""

    def __post_init__(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ValueError(f'model.embed_dim={self.embed_dim} is not divisible by '
                             f'model.num_heads={self.num_heads}')
        if self.embed_dim // self.num_heads != 64:
            raise ValueError('model: the 3-D video RoPE splits a head of 64 dims (20/22/22); '
                             f'got head dim {self.embed_dim // self.num_heads}')
        if (2 * self.embed_dim) % self.camera_num_heads:
            raise ValueError(f'model.camera_num_heads={self.camera_num_heads} does not divide '
                             f'2*embed_dim={2 * self.embed_dim}')
        if len(self.tap_layers) != 4 or not all(0 <= i < self.depth for i in self.tap_layers):
            raise ValueError(f'model.tap_layers={self.tap_layers} must be 4 layer indices in '
                             f'[0, {self.depth})')
        if len(self.depth_out_channels) != 4:
            raise ValueError(f'model.depth_out_channels={self.depth_out_channels} needs 4 values')
        if self.max_frame_num < 2:
            raise ValueError(f'model.max_frame_num={self.max_frame_num} must be >= 2')
        if self.camera_num_iterations < 1:
            raise ValueError('model.camera_num_iterations must be >= 1, '
                             f'got {self.camera_num_iterations}')

    @property
    def head_dim(self) -> int:
        """Per-head width of the trunk and aggregator attention."""
        return self.embed_dim // self.num_heads

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> 'ModelConfig':
        """Return the named preset ('official' or 'tiny'), with field overrides.

        Raises:
            ValueError: unknown preset name.
        """
        if name == 'official':
            return cls(**overrides)
        if name == 'tiny':
            tiny = {'preset': 'tiny', 'embed_dim': 128, 'num_heads': 2, 'dino_depth': 2,
                    'depth': 4, 'tap_layers': (0, 1, 2, 3), 'camera_trunk_depth': 2,
                    'camera_num_heads': 2, 'depth_features': 32,
                    'depth_out_channels': (32, 64, 128, 128)}
            return cls(**{**tiny, **overrides})
        raise ValueError(f"model.preset='{name}' is not one of 'official', 'tiny'")


@dataclass(frozen=True)
class CacheConfig:
    """Global-attention KV cache: window sizes, capacity, storage dtype and attention backend."""

    backend: Backend = 'auto'
    """Attention over the paged cache: 'flashinfer' (CUDA), 'sdpa' (any device), 'reference'
    (fp32 gather + SDPA, for checks), 'triton' (CUDA: our kernel, docs/gpu_memory.md), 'fa3'
    (Hopper: FlashAttention-3 from the fa3-fwd package, the run in parts), 'auto' (the fastest
    combination that passes the long-sequence fidelity gate on this device under
    ``precision``: engine/attention/backend_choice.py, docs/performance.md)."""
    precision: Precision = 'faithful'
    """'faithful': only attention products that keep the official model's bf16 accuracy on
    long real sequences (the fidelity gate, docs/performance.md); FP8 K/V storage is fine, FP8
    queries are not (FP8 keys meet queries carried in two e4m3 terms). 'fast_approximate':
    also the single-e4m3-query FP8 products ('fa3' with FP8 K/V, 'triton' with one term):
    faster, but several times the official bf16 run's pose error; logged as a warning and shown
    in the diagnostics."""
    scale_frames: int = 8
    """First frames run together bidirectionally and pinned in the cache forever (N_s)."""
    sliding_window: int = 64
    """Most recent keyframes whose patch tokens stay cached (W)."""
    max_total_frames: int = 320
    """Capacity of the special-token stream, in keyframes, allocated at start. One session
    (``stream.session_keyframes``, which must not exceed it) is all it ever holds: rollovers
    start the next session before it fills."""
    dtype: CacheDType = 'bfloat16'
    """KV storage dtype on CUDA (CPU stores float32). 'float8_e4m3fn' halves the cache on
    any device: K/V are stored in e4m3 (unit scale), widened to the attention dtype on read
    ('sdpa', 'reference') or read as FP8 ('triton'); 'flashinfer' refuses it. See
    docs/gpu_memory.md."""
    streams: int = 1
    """Streams the engine's page pool holds at once (a camera's session; each also gets room for
    its rollover's next session's scale pages). Sizes the pool when ``pool_pages`` is 0."""
    pool_pages: int = 0
    """Pages of the engine's KV page pool, per layer (patch and special pages). 0 derives it:
    ``streams`` x (N_s + W + 1 patch pages + the special pages of ``max_total_frames`` + the
    N_s scale pages and special page of the next session a rollover prepares).
    A stream that finds no room is refused (PoolExhaustedError) before anything is written."""
    kernel: KernelConfig = field(default_factory=KernelConfig)
    """Expert tuning of the attention kernels, ``cache.kernel.*`` (``kernel_config.py``)."""

    def __post_init__(self) -> None:
        if self.precision not in typing.get_args(Precision):
            raise ValueError(f"cache.precision='{self.precision}' is not one of "
                             f"{', '.join(typing.get_args(Precision))}")
        if self.streams < 1:
            raise ValueError(f'cache.streams={self.streams} must be >= 1')
        if self.pool_pages < 0:
            raise ValueError(f'cache.pool_pages={self.pool_pages} must be >= 0 (0: derived)')
        if self.scale_frames < 1:
            raise ValueError(f'cache.scale_frames={self.scale_frames} must be >= 1')
        if self.sliding_window < 1:
            raise ValueError(f'cache.sliding_window={self.sliding_window} must be >= 1')
        if self.max_total_frames < self.scale_frames + 1:
            raise ValueError(f'cache.max_total_frames={self.max_total_frames} must exceed '
                             f'cache.scale_frames={self.scale_frames}')
        if self.kernel.triton_qk == 'single' and self.precision == 'faithful':
            raise ValueError("cache.kernel.triton_qk='single' (one e4m3 query term) is outside "
                             "the fidelity gate: it needs cache.precision 'fast_approximate'")


@dataclass(frozen=True)
class StreamConfig:
    """How frames are fed to the session and which outputs it computes."""

    device: str = 'cuda'
    """Torch device for the engine ('cuda', 'cuda:1', 'cpu')."""
    dtype: DType = 'bfloat16'
    """Aggregator compute dtype on CUDA (the depth head runs in float32, the camera head as
    ``camera_head_dtype`` says; CPU always float32)."""
    camera_head_dtype: HeadDType = 'bfloat16'
    """Weights of the camera head's trunk and modulation on CUDA with a bf16 ``dtype``:
    'bfloat16' halves the bytes of its GEMVs (its LayerNorms, pose branch and pose sum stay
    float32; docs/performance.md); ignored where ``dtype`` is float32 or on the CPU."""
    image_width: int = 518
    """Width images are resized to (crop mode); the height keeps the aspect, snapped to 14."""
    keyframe_interval: int = 1
    """Every K-th streaming frame is cached (K=1: every frame)."""
    enable_depth: bool = False
    """Run the DPT depth head on every frame (needed for depth and point-cloud outputs)."""
    fast_path: FastPath = 'whole_frame'
    """How streaming frames run on CUDA, as an upper bound: 'eager' (op by op), 'segments'
    (the fixed-shape work between cache attentions replayed as CUDA graphs, the attention eager
    between them) or 'whole_frame' (the whole aggregator frame, cache attention included, one
    graph). The cache backend caps it ('sdpa': whole_frame; 'flashinfer': segments); the mode
    in effect is reported in diagnostics. Heads are graphed unless 'eager'. On the CPU there
    are no graphs: frames run eagerly unless ``compile`` is on."""
    compile: bool = False  # noqa: A003 - the parameter's name; a field, never called
    """``torch.compile`` (Inductor) the fixed-shape work of the fast path before it is
    captured: fuses the LayerNorm/cast/RoPE/residual kernels. Orthogonal to ``fast_path``
    (nothing to compile with 'eager'). Costs a one-off compilation at the first image of each
    size, before it is used (the session's warm-up; cached on disk by Inductor for later
    starts); falls back to uncompiled with a warning where Inductor cannot run."""
    session_keyframes: int = 320
    """Keyframes per engine session before a rollover: a new session starts, seeded with the
    last ``overlap_keyframes`` keyframes, and is Sim(3)-aligned so the published trajectory
    stays continuous (docs/odometry.md). 320: the sequence length the model was trained on,
    well inside the RoPE table and the cache."""
    overlap_keyframes: int = 8
    """Last keyframes of the ending session that run again as the next session's scale phase
    (>= cache.scale_frames, < session_keyframes); their poses align the two sessions."""

    def __post_init__(self) -> None:
        if self.keyframe_interval < 1:
            raise ValueError(f'stream.keyframe_interval={self.keyframe_interval} must be >= 1')
        if self.camera_head_dtype not in ('float32', 'bfloat16'):
            raise ValueError(f"stream.camera_head_dtype='{self.camera_head_dtype}' is not "
                             "'float32' or 'bfloat16'")
        if self.fast_path not in ('eager', 'segments', 'whole_frame'):
            raise ValueError(f"stream.fast_path='{self.fast_path}' is not 'eager', 'segments' "
                             "or 'whole_frame'")
        if self.image_width < 14 or self.image_width % 14:
            raise ValueError(f'stream.image_width={self.image_width} must be a positive '
                             'multiple of 14')
        if not 1 <= self.overlap_keyframes < self.session_keyframes:
            raise ValueError(f'stream.overlap_keyframes={self.overlap_keyframes} must be >= 1 '
                             f'and < stream.session_keyframes={self.session_keyframes}')


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs; built from YAML, ROS parameters or tool flags."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)

    def __post_init__(self) -> None:
        """Check the settings that span sections."""
        stream, cache = self.stream, self.cache
        if self.model.max_frame_num <= cache.scale_frames:
            raise ValueError(
                f'model.max_frame_num={self.model.max_frame_num} must be larger than '
                f'cache.scale_frames={cache.scale_frames}: the scale phase alone would '
                'fill the RoPE table and no pose would ever be published')
        if stream.overlap_keyframes < cache.scale_frames:
            raise ValueError(f'stream.overlap_keyframes={stream.overlap_keyframes} must be >= '
                             f'cache.scale_frames={cache.scale_frames}: the overlap is the next '
                             "session's scale phase")
        limit = min(self.model.max_frame_num, cache.max_total_frames)
        if stream.session_keyframes > limit:
            raise ValueError(f'stream.session_keyframes={stream.session_keyframes} must be <= '
                             f'model.max_frame_num={self.model.max_frame_num} (RoPE table) and '
                             f'cache.max_total_frames={cache.max_total_frames}, so a rollover '
                             'comes before either limit')

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> 'EngineConfig':
        """Build from ``{'model.depth': 4, 'cache.backend': 'sdpa', ...}``.

        ``model.preset`` picks the base model; other ``model.*`` keys override it.

        Raises:
            ValueError: unknown key or bad value.
        """
        sections: dict[str, dict[str, Any]] = {'model': {}, 'cache': {}, 'stream': {},
                                               'cache.kernel': {}}
        for key, value in values.items():
            section, _, name = key.rpartition('.')
            if section not in sections or name not in _field_names(section):
                raise ValueError(f"unknown engine setting '{key}'")
            if isinstance(value, list):
                value = tuple(value)
            sections[section][name] = value
        preset = sections['model'].pop('preset', 'official')
        return cls(model=ModelConfig.from_preset(preset, **sections['model']),
                   cache=CacheConfig(**sections['cache'],
                                     kernel=KernelConfig(**sections['cache.kernel'])),
                   stream=StreamConfig(**sections['stream']))

    def to_flat(self) -> dict[str, Any]:
        """Inverse of :meth:`from_flat`."""
        out: dict[str, Any] = {}
        for section in ('model', 'cache', 'stream'):
            out.update(_flatten(dataclasses.asdict(getattr(self, section)), f'{section}.'))
        return out


_SECTIONS = {'model': ModelConfig, 'cache': CacheConfig, 'stream': StreamConfig,
             'cache.kernel': KernelConfig}
# Sections with field docstrings (``field_docs``); 'map' and 'metric' are not part of
# EngineConfig.
_DOCUMENTED = {**_SECTIONS, 'map': MapConfig, 'metric': MetricConfig, 'loop': LoopConfig}
_DOCUMENTED['grid'] = GridConfig
_DOCUMENTED['imu'] = ImuConfig  # the IMU beside the camera (imu_config.py)


def _field_names(section: str) -> set[str]:
    # A nested section (``cache.kernel``) is set through its own fields only.
    return {f.name for f in fields(_SECTIONS[section]) if f'{section}.{f.name}' not in _SECTIONS}


def field_docs(section: str) -> dict[str, str]:
    """Docstrings of a section's fields (used for ROS parameter descriptions)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_DOCUMENTED[section]))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            docs[node.target.id] = ' '.join(nxt.value.value.split())  # type: ignore[attr-defined]
    return docs


def load_yaml(path: str | Path, node_name: str = 'lingbot_map') -> dict[str, Any]:
    """Read ``<node_name>: ros__parameters:`` of a ROS parameter file as a flat dict.

    Nested mappings are flattened with dots, as ROS does (``cache: {backend: x}`` ->
    ``cache.backend``). A ``/**`` wildcard section is accepted too.

    Raises:
        ValueError: the file has no parameters for ``node_name``.
    """
    with open(path, encoding='utf-8') as f:
        doc = yaml.safe_load(f) or {}
    for key in (node_name, f'/{node_name}', '/**', '**'):
        if key in doc and 'ros__parameters' in (doc[key] or {}):
            return _flatten(doc[key]['ros__parameters'])
    raise ValueError(f"{path}: no '{node_name}: ros__parameters:' section")


def _flatten(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f'{prefix}{key}'
        if isinstance(value, dict):
            flat.update(_flatten(value, name + '.'))
        else:
            flat[name] = value
    return flat


def engine_config_from_yaml(path: str | Path, **overrides: Any) -> EngineConfig:
    """Build an EngineConfig from the engine keys (model./cache./stream.) of a parameter file."""
    flat = {k: v for k, v in load_yaml(path).items() if k.partition('.')[0] in _SECTIONS}
    flat.update(overrides)
    return EngineConfig.from_flat(flat)
