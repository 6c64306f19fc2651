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
"""ROS parameters of ``lingbot_map_node``: one table, from the dataclasses to descriptors.

Engine parameters are exactly the fields of :class:`~lingbot_map_ros.config.EngineConfig`, named
``model.*``, ``cache.*`` (the nested ``cache.kernel`` as ``cache.kernel.*``) and ``stream.*``;
their defaults and descriptions come from the dataclasses (``config.field_docs``).
``model.preset`` is declared first and the other ``model.*`` defaults come from that preset, so
a parameter file that only sets ``model.preset: tiny`` gets the whole tiny model. Node
parameters (weights, outputs, diagnostics, and the inputs, cameras and frames of
:mod:`~lingbot_map_ros.ros.parameters.input_params`) are listed in :data:`NODE_PARAMS`; the
``map.*`` and ``metric.*`` parameters are the fields of
:class:`~lingbot_map_ros.config.MapConfig` and :class:`~lingbot_map_ros.config.MetricConfig`,
declared the same way.

Everything that sizes GPU memory or the model is read-only. Of the engine fields only
:data:`LIVE_ENGINE_PARAMS` may change at run time; they take effect at the next session reset.

``python -m lingbot_map_ros.ros.parameters.params`` prints the parameter table as Markdown.
"""

from __future__ import annotations

from dataclasses import asdict, fields
import typing
from typing import Any

from lingbot_map_ros import config, kernel_config
from lingbot_map_ros.ros.parameters import input_params, param_checks, param_names
from lingbot_map_ros.ros.parameters.param_spec import LIVE as _LIVE, ParamSpec, RO as _RO
from lingbot_map_ros.ros.parameters.save_directory import DEFAULT_DIRECTORY

ENGINE_SECTIONS: tuple[str, ...] = ('model', 'cache', 'stream')
KERNEL_SECTION = 'cache.kernel'
"""``cache.kernel.*`` (``config.KernelConfig``): expert, benchmark-tuned, all read-only."""

LIVE_ENGINE_PARAMS: frozenset[str] = frozenset({'stream.keyframe_interval',
                                                'stream.enable_depth'})
"""Engine parameters that may change while running (applied at the next reset)."""

MIN_MAP_PERIOD_S = 0.05
"""Shortest ``map.period_s``: a faster timer only spins a core (the map changes per keyframe)."""
MIN_VOXEL_SIZE, MAX_VOXEL_SIZE = 1e-6, 1e6
"""Bounds of ``map.voxel_size`` (map units; the map's scale is about 1 per median depth)."""

MAP_SECTION = 'map'
LIVE_MAP_PARAMS: frozenset[str] = frozenset({'map.enable', 'map.confidence_percentile',
                                             'map.min_confidence', 'map.pixel_stride',
                                             'map.load_path', 'map.save_path', 'map.mode',
                                             'map.localize_matches'})
"""``map.*`` parameters that take effect with the next keyframe (``map.load_path``,
``map.save_path``, ``map.mode``: with the next ``~/load_map`` or ``~/save_map``); the others
size the map."""

METRIC_SECTION = 'metric'
"""``metric.*`` (metric scale from a depth camera): all read-only (they pick subscriptions)."""

GRID_SECTION = 'grid'
"""``grid.*`` (the occupancy grid ``~/grid``, docs/map.md): all read-only (they size the grid)."""

IMU_SECTION = 'imu'
"""``imu.*`` (the IMU of ``input.imu_topic``, docs/imu.md): all read-only (they size the fusion);
the topic itself is ``input.imu_topic``."""

IMU_IDENTITY_MOUNT = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
"""The node's ``imu.imu_from_camera`` default: the IMU at the camera's optical frame (replaced by
/tf_static when tf2_ros finds the IMU frame -> camera frame there)."""

LOOP_SECTION = 'loop'
"""``loop.*`` (loop closure, docs/loop_closure.md): all read-only (they size the closer).
``loop.enable`` defaults to true but for the tiny preset (random weights: no places)."""


NODE_PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec('weights', '', 'Checkpoint file (.pt / .safetensors). Required unless '
              'allow_random_weights is true.', _RO),
    ParamSpec('allow_random_weights', False, 'Run without weights on a randomly initialised '
              'model (demos and tests only; the poses are meaningless).', _RO),
    ParamSpec('seed', 0, 'Seed of the random initialisation (with allow_random_weights).', _RO,
              int_range=(0, 2**31 - 1, 0)),
) + input_params.INPUT_PARAMS + (
    ParamSpec('publish.tf', True, 'Broadcast odom_frame -> base_frame on /tf (needs tf2_ros).',
              _LIVE),
    ParamSpec('publish.map_tf', True, 'Broadcast map_frame -> odom_frame on /tf: from the pose '
              'graph with loop closure, else a static identity (needs frames.map_frame).', _RO),
    ParamSpec('publish.depth', False, 'Publish ~/depth/image (32FC1: metres with '
              'metric.source depth, else model units) and ~/depth/camera_info; needs '
              'stream.enable_depth.', _LIVE),
    ParamSpec('publish.cloud', False, 'Publish ~/cloud (PointCloud2 xyz+rgb in odom_frame); '
              'needs stream.enable_depth.', _LIVE),
    ParamSpec('publish.cloud_stride', 4, 'Keep every n-th pixel in each direction for ~/cloud.',
              _LIVE, int_range=(1, 64, 0)),
    ParamSpec('publish.path_max_poses', 1000, 'Poses kept in ~/path (oldest dropped); 0 turns '
              '~/path off.', _LIVE, int_range=(0, 100000, 0)),
    ParamSpec('output.directory', DEFAULT_DIRECTORY, '~/save writes a new timestamped '
              'folder under this directory (~ and $VARS are expanded; empty, an unset $VAR or '
              'an unknown ~user is refused; a relative path is taken from the working '
              'directory; replies give absolute paths).', _LIVE),
    ParamSpec('output.max_poses', 1_000_000, 'Poses kept for the trajectory ~/save writes '
              '(104 bytes each: 1e6 = 104 MB, 9 h at 30 Hz); past it the oldest are dropped '
              '(logged, noted in the file).', _LIVE, int_range=(1, 10_000_000, 0)),
    ParamSpec('diagnostics.period_s', 1.0, 'Period of the /diagnostics message.', _LIVE,
              float_range=(0.05, 60.0)),
    ParamSpec('diagnostics.stale_after_s', 5.0, 'Input status is STALE when no image arrived '
              'for this long.', _LIVE, float_range=(0.1, 3600.0)),
    ParamSpec('diagnostics.stall_after_s', 10.0, 'Engine status is ERROR while one frame has '
              'been in progress for longer than this.', _LIVE, float_range=(0.1, 3600.0)),
    ParamSpec('diagnostics.no_input_warn_s', 5.0, 'Log a warning, once per topic, when '
              'nothing has arrived on an expected input (image, depth) for this long after '
              'start, naming the image topics the graph has; 0 turns it off.', _RO,
              float_range=(0.0, 3600.0)),
)

# Bounds announced for integers (the dataclasses check them again). Every numeric parameter has
# one: rclpy refuses a value outside it (NaN and +-inf included) at start-up and at run time.
_INT_RANGES: dict[str, tuple[int, int, int]] = {
    'model.img_size': (14, 4088, 14),
    'model.patch_size': (1, 64, 0),
    'model.embed_dim': (64, 8192, 0),
    'model.num_heads': (1, 128, 0),
    'model.dino_depth': (1, 128, 0),
    'model.depth': (1, 128, 0),
    'model.num_dino_registers': (0, 64, 0),
    'model.camera_trunk_depth': (1, 64, 0),
    'model.camera_num_heads': (1, 256, 0),
    'model.depth_features': (1, 8192, 0),
    'model.max_frame_num': (2, 1_000_000, 0),
    'model.camera_num_iterations': (1, 64, 0),
    'cache.scale_frames': (1, 1024, 0),
    'cache.sliding_window': (1, 100_000, 0),
    'cache.max_total_frames': (2, 10_000_000, 0),
    'cache.streams': (1, 1024, 0),
    'cache.pool_pages': (0, 100_000_000, 0),
    'stream.image_width': (14, 4088, 14),
    'stream.keyframe_interval': (1, 10_000, 0),
    'stream.session_keyframes': (2, 1_000_000, 0),
    'stream.overlap_keyframes': (1, 1_000_000, 0),
    'map.max_points': (1, 1_000_000_000, 0),
    'map.pixel_stride': (1, 64, 0),
    'map.localize_matches': (1, 100, 0),
    'grid.max_cells': (1, 100_000_000, 0),
    'metric.settle_keyframes': (1, 1_000_000, 0),
    'loop.candidates': (1, 100, 0),
    'loop.exclude_recent': (0, 1_000_000, 0),
    'loop.separation': (0, 1_000_000, 0),
    'loop.verify_frames': (1, 64, 0),
    'loop.verify_unit_interval': (1, 10_000, 0),
    **{f'cache.kernel.{k}': (lo, hi, 0) for k, (lo, hi) in kernel_config.INT_BOUNDS.items()},
}
_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    'model.mlp_ratio': (0.25, 16.0),
    'map.voxel_size': (MIN_VOXEL_SIZE, MAX_VOXEL_SIZE),
    'map.confidence_percentile': (0.0, 100.0),
    'map.min_confidence': (0.0, 1e6),
    'map.period_s': (MIN_MAP_PERIOD_S, 3600.0),
    'grid.resolution': (1e-6, 1000.0),
    'grid.min_height': (-1000.0, 1000.0),
    'grid.max_height': (-1000.0, 1000.0),
    'grid.max_range': (1e-6, 1000.0),
    'grid.occupied_threshold': (0.0, 1.0),
    'grid.free_threshold': (0.0, 1.0),
    'grid.period_s': (MIN_MAP_PERIOD_S, 3600.0),
    'metric.max_dt_s': (1e-6, 1.0),
    'metric.min_valid_fraction': (1e-4, 1.0),
    'metric.max_range_m': (0.0, 1000.0),
    'metric.depth_wait_s': (0.0, 10.0),
    'imu.time_offset_s': (-1.0, 1.0),
    'imu.gyro_noise_density': (0.0, 10.0),
    'imu.accel_noise_density': (0.0, 100.0),
    'imu.gyro_random_walk': (0.0, 10.0),
    'imu.accel_random_walk': (0.0, 100.0),
    'imu.gyro_range': (0.0, 1e4),
    'imu.accel_range': (0.0, 1e4),
    'imu.min_rate_hz': (0.0, 1e5),
    'imu.max_gap_s': (1e-4, 10.0),
    'imu.max_future_s': (0.0, 60.0),
    'imu.buffer_s': (1.0, 3600.0),
    'imu.odometry_translation_walk': (0.0, 100.0),
    'loop.min_score': (-1.0, 1.0),
    'loop.min_inlier_fraction': (0.0, 1.0),
    'loop.inlier_threshold': (1e-6, 10.0),
    'loop.max_residual': (1e-3, 1e6),
    'loop.odometry_translation_sigma': (1e-6, 10.0),
    'loop.odometry_rotation_sigma': (1e-6, 10.0),
    'loop.odometry_scale_sigma': (1e-6, 10.0),
    'loop.image_store_mb': (0.0, 1e6),
}


def engine_specs(preset: str = 'official') -> list[ParamSpec]:
    """Specs of the engine parameters, with ``model.*`` defaults taken from ``preset``.

    Args:
        preset: model preset whose values are the ``model.*`` defaults.

    Returns:
        One spec per EngineConfig field, ``model.preset`` first.

    Raises:
        ValueError: unknown preset.
    """
    defaults = config.EngineConfig(model=config.ModelConfig.from_preset(preset)).to_flat()
    specs = []
    for section in ENGINE_SECTIONS:
        cls = getattr(config, f'{section.capitalize()}Config')
        specs += _section_specs(section, cls, defaults, LIVE_ENGINE_PARAMS)
    # The expert kernel knobs (read-only: the kernels are built with the pool).
    return specs + _section_specs(KERNEL_SECTION, config.KernelConfig, defaults, frozenset())


def map_specs() -> list[ParamSpec]:
    """Specs of the ``map.*`` parameters, one per ``config.MapConfig`` field."""
    defaults = {f'{MAP_SECTION}.{k}': v for k, v in asdict(config.MapConfig()).items()}
    return _section_specs(MAP_SECTION, config.MapConfig, defaults, LIVE_MAP_PARAMS)


def grid_specs() -> list[ParamSpec]:
    """Specs of the ``grid.*`` parameters, one per ``config.GridConfig`` field."""
    defaults = {f'{GRID_SECTION}.{k}': v for k, v in asdict(config.GridConfig()).items()}
    return _section_specs(GRID_SECTION, config.GridConfig, defaults, frozenset())


def metric_specs() -> list[ParamSpec]:
    """Specs of the ``metric.*`` parameters, one per ``config.MetricConfig`` field."""
    defaults = {f'{METRIC_SECTION}.{k}': v for k, v in asdict(config.MetricConfig()).items()}
    return _section_specs(METRIC_SECTION, config.MetricConfig, defaults, frozenset())


def imu_specs() -> list[ParamSpec]:
    """Specs of the ``imu.*`` parameters, one per ``config.ImuConfig`` field but the topic."""
    defaults = {f'{IMU_SECTION}.{k}': v for k, v in asdict(config.ImuConfig()).items()
                if k != 'topic'}  # the topic is input.imu_topic
    defaults[f'{IMU_SECTION}.imu_from_camera'] = IMU_IDENTITY_MOUNT
    return _section_specs(IMU_SECTION, config.ImuConfig, defaults, frozenset())


def imu_config(values: dict[str, Any]) -> config.ImuConfig:
    """Return the ``ImuConfig`` of ``input.imu_topic`` and the ``imu.*`` values.

    Raises:
        ValueError: a bad ``imu.*`` value.
    """
    own = {k: v for k, v in values.items() if k.startswith(IMU_SECTION + '.')}
    own['imu.topic'] = values.get('input.imu_topic', '')
    mount = own.get('imu.imu_from_camera')
    if mount is not None:
        own['imu.imu_from_camera'] = tuple(float(v) for v in mount)
    return config.ImuConfig.from_flat(own)


def loop_specs(preset: str = 'official') -> list[ParamSpec]:
    """Specs of the ``loop.*`` parameters; ``loop.enable`` is off for the tiny preset."""
    defaults = {f'{LOOP_SECTION}.{k}': v for k, v in asdict(config.LoopConfig()).items()}
    defaults[f'{LOOP_SECTION}.enable'] = preset != 'tiny'
    return _section_specs(LOOP_SECTION, config.LoopConfig, defaults, frozenset())


def metric_problem(values: dict[str, Any]) -> str | None:
    """Return why the ``metric.*`` values cannot work with the others, or None."""
    try:
        metric = config.MetricConfig.from_flat(values)
        imu_config(values)  # the imu.* values checked with the metric ones
    except ValueError as exc:
        return str(exc)
    if metric.enabled and not (values['stream.enable_depth'] and values['model.enable_depth']):
        return ("metric.source 'depth' needs stream.enable_depth and model.enable_depth true: "
                "the model's depth is what the sensor's depth is compared with")
    return None


def _section_specs(section: str, cls: type, defaults: dict[str, Any],
                   live: frozenset[str]) -> list[ParamSpec]:
    docs = config.field_docs(section)
    hints = typing.get_type_hints(cls)
    specs = []
    for f in fields(cls):
        name = f'{section}.{f.name}'
        if name not in defaults:  # a nested section (cache.kernel): declared on its own
            continue
        default = defaults[name]
        choices = tuple(typing.get_args(hints[f.name])) \
            if typing.get_origin(hints[f.name]) is typing.Literal else ()
        specs.append(ParamSpec(
            name, list(default) if isinstance(default, tuple) else default,
            docs.get(f.name, ''), read_only=name not in live,
            choices=choices, int_range=_INT_RANGES.get(name),
            float_range=_FLOAT_RANGES.get(name)))
    return specs


def all_specs(preset: str = 'official') -> list[ParamSpec]:
    """Engine, map, metric and node specs: every parameter the node declares."""
    return (engine_specs(preset) + map_specs() + metric_specs() + loop_specs(preset) +
            imu_specs() + list(NODE_PARAMS) + grid_specs())


def check_value(spec: ParamSpec, value: Any) -> str | None:
    """Check a value against its spec: choices, ranges, array elements, frame ids, directory.

    rclpy checks types, scalar ranges and read-only too; the ranges are checked here again so
    that every refusal, start-up or run time, carries a reason naming the parameter.

    Args:
        spec: the parameter's spec.
        value: proposed value.

    Returns:
        None when acceptable, else the reason it is refused.
    """
    if spec.default == ():  # names: input_params.check_cameras
        return None
    if spec.choices and value not in spec.choices:
        return f"{spec.name}='{value}' is not one of {', '.join(spec.choices)}"
    bounds = spec.float_range or (spec.int_range[:2] if spec.int_range else None)
    return param_checks.check_value(spec.name, value, bounds)


def engine_config(values: dict[str, Any]) -> config.EngineConfig:
    """Build the EngineConfig from flat parameter values (non-engine keys are ignored).

    Args:
        values: ``{'model.preset': 'tiny', 'cache.backend': 'sdpa', ..., 'weights': ...}``.

    Returns:
        The engine configuration.

    Raises:
        ValueError: a bad engine value (from the dataclass checks).
    """
    flat = {k: v for k, v in values.items() if k.partition('.')[0] in ENGINE_SECTIONS}
    return config.EngineConfig.from_flat(flat)


def known_names(cameras: Any = ()) -> set[str]:
    """Every parameter name the node declares with these camera names (their mountings too).

    Args:
        cameras: the names of ``input.cameras``.
    """
    return {s.name for s in all_specs()} | {input_params.mount_param(n) for n in cameras or ()}


def check_names(names: Any, cameras: Any = ()) -> None:
    """Refuse parameter names the node does not know (the node's and the tools' one check).

    Args:
        names: the names given (a parameter file's keys, ``-p`` names, ``--set`` keys).
        cameras: the names of ``input.cameras`` (each declares its mounting).

    Raises:
        ValueError: an unknown name; the message names it and the nearest known names.
    """
    problem = param_names.unknown_problem(names, known_names(cameras))
    if problem:
        raise ValueError(problem)


def markdown_table(preset: str = 'official') -> str:
    """Render every parameter as a Markdown table (name, default, read-only, description)."""
    rows = ['| name | default | read-only | description |', '|---|---|---|---|']
    for spec in all_specs(preset):
        default = f"'{spec.default}'" if isinstance(spec.default, str) else spec.default
        extra = f' ({spec.descriptor().additional_constraints})' if spec.choices else ''
        rows.append(f'| `{spec.name}` | `{default}` | {"yes" if spec.read_only else "no"} | '
                    f'{spec.description}{extra} |')
    return '\n'.join(rows)


if __name__ == '__main__':
    import sys

    sys.stdout.write(markdown_table() + '\n')
