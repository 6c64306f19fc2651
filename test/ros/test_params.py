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
"""Parameters: YAML files == declared parameters == EngineConfig fields; descriptors; checks.

Run: ``pytest test/ros/test_params.py`` (a second; plain rclpy nodes, no engine; marker rostest).
"""

from dataclasses import asdict, fields
from pathlib import Path

from lingbot_map_ros import config
from lingbot_map_ros.ros.parameters import input_params, node_params, params
import pytest
import rclpy
from rclpy.node import Node

CONFIG_DIR = Path(__file__).resolve().parents[2] / 'config'
YAMLS = sorted(CONFIG_DIR.glob('*.yaml'))
pytestmark = pytest.mark.rostest

READ_ONLY_ENGINE = {'cache.backend', 'cache.scale_frames', 'cache.sliding_window',
                    'cache.max_total_frames', 'cache.dtype', 'stream.device', 'stream.dtype',
                    'stream.image_width'}


def engine_fields():
    names = {f'{section}.{f.name}' for section in params.ENGINE_SECTIONS
             for f in fields(getattr(config, f'{section.capitalize()}Config'))}
    # The nested section cache.kernel is its own fields.
    names.remove(params.KERNEL_SECTION)
    return names | {f'{params.KERNEL_SECTION}.{f.name}' for f in fields(config.KernelConfig)}


def test_both_parameter_files_are_shipped():
    assert {p.name for p in YAMLS} == {'lingbot_map.yaml', 'demo_tiny_cpu.yaml', 'small_gpu.yaml',
                                       'two_cameras.yaml'}


def test_the_kernel_knobs_are_read_only_parameters_with_their_defaults_and_bounds():
    specs = {s.name: s for s in params.engine_specs() if s.name.startswith('cache.kernel.')}
    assert sorted(specs) == sorted(f'cache.kernel.{f.name}' for f in fields(config.KernelConfig))
    assert all(s.read_only for s in specs.values())
    assert specs['cache.kernel.triton_block_m'].default == 128
    assert specs['cache.kernel.triton_block_m'].int_range == (16, 256, 0)
    assert specs['cache.kernel.lanes'].default is True
    assert specs['cache.kernel.triton_qk'].choices == ('auto', 'split', 'single', 'widened')
    assert 'power of two' in specs['cache.kernel.triton_block_m'].description
    assert 'triton_splits' in params.check_value(specs['cache.kernel.triton_splits'], 0)


@pytest.mark.parametrize('path', YAMLS, ids=lambda p: p.name)
def test_yaml_keys_equal_declared_parameters_and_dataclass_fields(path):
    flat = config.load_yaml(path)
    keys = set(flat)
    declared = {s.name for s in params.all_specs()}
    # With several cameras, one mounting per camera too (config/two_cameras.yaml).
    declared |= {input_params.mount_param(n) for n in flat['input.cameras']}
    assert keys == declared
    assert {k for k in keys if k.partition('.')[0] in params.ENGINE_SECTIONS} == \
        engine_fields()


@pytest.mark.parametrize('path', YAMLS, ids=lambda p: p.name)
def test_yaml_loads_into_a_node_with_the_declared_types(path, context):
    """Check that rclpy refuses a YAML value of the wrong type (4 for a double)."""
    node = Node('lingbot_map', context=context, namespace='/yaml_check',
                cli_args=['--ros-args', '--params-file', str(path)])
    try:
        values = node_params.declare_all(node)
    finally:
        node.destroy_node()
    expected = config.load_yaml(path)
    assert {k: values[k] for k in expected} == expected


def test_yaml_model_sections_match_their_presets():
    for name, preset in (('lingbot_map.yaml', 'official'), ('demo_tiny_cpu.yaml', 'tiny'),
                         ('small_gpu.yaml', 'official')):
        flat = config.load_yaml(CONFIG_DIR / name)
        built = params.engine_config(flat)
        assert asdict(built.model) == asdict(config.ModelConfig.from_preset(preset)), name


def test_robot_defaults_and_demo_overrides():
    robot = config.load_yaml(CONFIG_DIR / 'lingbot_map.yaml')
    assert (robot['cache.backend'], robot['stream.device']) == ('auto', 'cuda')
    assert robot['stream.camera_head_dtype'] == 'bfloat16'
    assert robot['cache.dtype'] == 'float8_e4m3fn'  # docs/gpu_memory.md: measured default
    assert robot['weights'] == '' and robot['allow_random_weights'] is False
    demo = config.load_yaml(CONFIG_DIR / 'demo_tiny_cpu.yaml')
    assert (demo['model.preset'], demo['stream.device'], demo['cache.backend']) == \
        ('tiny', 'cpu', 'sdpa')
    assert demo['allow_random_weights'] is True


def test_descriptors_read_only_ranges_and_descriptions():
    specs = {s.name: s for s in params.all_specs()}
    for name, spec in specs.items():
        assert spec.description, name
        if name.startswith('model.') or name in READ_ONLY_ENGINE:
            assert spec.read_only, name
    assert not specs['stream.keyframe_interval'].read_only
    assert not specs['stream.enable_depth'].read_only
    assert not specs['publish.cloud'].read_only
    desc = specs['stream.image_width'].descriptor()
    assert (desc.integer_range[0].from_value, desc.integer_range[0].step) == (14, 14)
    assert 'flashinfer' in specs['cache.backend'].descriptor().additional_constraints
    assert specs['cache.sliding_window'].description == \
        config.field_docs('cache')['sliding_window']


def test_model_defaults_follow_the_declared_preset(context):
    node = Node('lingbot_map', context=context, namespace='/preset_check',
                parameter_overrides=[rclpy.parameter.Parameter('model.preset', value='tiny')])
    try:
        values = node_params.declare_all(node)
        assert values['model.embed_dim'] == 128
        assert node.describe_parameter('model.embed_dim').read_only
        assert not node.describe_parameter('publish.tf').read_only
    finally:
        node.destroy_node()


def test_bad_start_values_are_refused(context):
    for name, value, match in (('cache.backend', 'cudnn', 'one of'),
                               ('input.queue_mode', 'fast', 'one of'),
                               ('stream.keyframe_interval', 0, 'out of range|keyframe')):
        node = Node('lingbot_map', context=context, namespace='/bad_start',
                    parameter_overrides=[rclpy.parameter.Parameter(name, value=value)])
        try:
            with pytest.raises(Exception, match=match):
                node_params.declare_all(node)
        finally:
            node.destroy_node()


def test_check_changes_reasons():
    current = dict(config.load_yaml(CONFIG_DIR / 'demo_tiny_cpu.yaml'))
    assert node_params.check_changes({'publish.tf': False}, current) is None
    assert 'enable_depth' in node_params.check_changes({'publish.depth': True}, current)
    assert node_params.check_changes({'publish.depth': True, 'stream.enable_depth': True},
                                     current) is None
    on = {**current, 'stream.enable_depth': True, 'publish.cloud': True}
    assert 'enable_depth' in node_params.check_changes({'stream.enable_depth': False}, on)
    assert 'one of' in node_params.check_changes({'input.queue_mode': 'fast'}, current)


def test_markdown_table_lists_every_parameter():
    table = params.markdown_table()
    for spec in params.all_specs():
        assert f'`{spec.name}`' in table
