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
"""``lingbot_map_bench model --components``: the floors table, on the CPU with the tiny model.

Run: ``python -m pytest test/tools/test_bench_components.py`` (repo root; CPU only, ~30 s).
"""

from lingbot_map_ros.config import ModelConfig
from lingbot_map_ros.tools import bench
from lingbot_map_ros.tools.bench_components import attention_flops, classify, \
    kernel_ms_by_part, PART_ORDER
import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

N_S, W, HEIGHT, WIDTH = 2, 3, 126, 224
ARGS = ['model', '--preset', 'tiny', '--device', 'cpu', '--height', str(HEIGHT), '--width',
        str(WIDTH), '--frames', '8', '--warmup', '2', '--scale-frames', str(N_S), '--window',
        str(W), '--backend', 'sdpa', '--components', '1']


@pytest.fixture(scope='module')
def report():
    parser = bench.build_parser()
    return bench_model_run(parser.parse_args(ARGS))


def bench_model_run(args):
    return args.run(args)['floors']


def test_floors_table_structure_and_arithmetic(report):
    parts = {p['part']: p for p in report['parts']}
    # Every part of a pose-path frame is there (no depth head in this run).
    expected = set(PART_ORDER) - {'DPT head', 'other'}
    assert expected <= set(parts)
    ceilings = report['ceilings']
    assert ceilings['gemm_tflops'] > 0 and ceilings['copy_gbps'] > 0
    for p in report['parts']:
        assert p['measured_ms'] >= 0 and p['mbytes'] >= 0
        math_ms = p['flops'] / (ceilings['gemm_tflops'] * 1e12) * 1e3
        memory_ms = p['bytes'] / (ceilings['copy_gbps'] * 1e9) * 1e3
        assert p['floor_ms'] == pytest.approx(max(math_ms, memory_ms), rel=2e-3, abs=2e-4)
        assert p['bound'] == ('math' if math_ms >= memory_ms else 'memory')
        assert p['over_floor_ms'] == pytest.approx(p['measured_ms'] - p['floor_ms'], abs=2e-4)
    assert report['sum_parts_ms'] == pytest.approx(
        sum(p['measured_ms'] for p in report['parts']), abs=2e-3)
    assert report['gaps_ms'] == pytest.approx(
        report['graphed_frame_ms'] - report['sum_parts_ms'], abs=2e-3)
    # Norms and elementwise work do no matrix FLOPs: their floors are bytes.
    assert parts['norms']['flops'] == 0 and parts['norms']['bound'] == 'memory'


def test_flop_counts_match_a_hand_computation_for_the_tiny_shapes(report):
    cfg = ModelConfig.from_preset('tiny')
    c, hw = cfg.embed_dim, (HEIGHT // 14) * (WIDTH // 14)
    dino_tokens = 1 + cfg.num_dino_registers + hw      # cls, registers, patches
    frame_tokens = 6 + hw                              # camera, 4 registers, scale, patches
    hidden = int(c * cfg.mlp_ratio)
    gflop = {p['part']: p['flops'] for p in report['parts']}

    def linears(tokens, depth):
        return (2 * tokens * (c * 3 * c + c * c) * depth, 2 * tokens * 2 * c * hidden * depth)
    for group, tokens, depth in (('DINO', dino_tokens, cfg.dino_depth),
                                 ('frame', frame_tokens, cfg.depth),
                                 ('global', frame_tokens, cfg.depth)):
        qkv_proj, mlp = linears(tokens, depth)
        assert gflop[f'linear {group} qkv+proj'] == pytest.approx(qkv_proj, rel=1e-3)
        assert gflop[f'linear {group} mlp'] == pytest.approx(mlp, rel=1e-3)
    assert gflop['DINO attention'] == pytest.approx(4 * dino_tokens**2 * c * cfg.dino_depth,
                                                    rel=1e-3)
    assert gflop['frame attention'] == pytest.approx(4 * frame_tokens**2 * c * cfg.depth,
                                                     rel=1e-3)
    # A keyframe with the window full: N_s + W pages of patches and 6 specials per keyframe.
    keys = report['cache_keys']
    assert keys > (N_S + W) * hw and (keys - (N_S + W) * hw) % 6 == 0
    assert gflop['cache attention'] == pytest.approx(4 * frame_tokens * c * keys * cfg.depth,
                                                     rel=1e-3)


def test_classify_and_attention_flops():
    assert classify('aggregator.patch_embed.blocks.3.attn.qkv', 'addmm') == \
        'linear DINO qkv+proj'
    assert classify('aggregator.global_blocks.0.mlp.fc2', 'mm') == 'linear global mlp'
    assert classify('aggregator.frame_blocks.7', '_scaled_dot_product_cudnn_attention') == \
        'frame attention'
    assert classify('aggregator.global_blocks.7.norm1', 'native_layer_norm') == 'norms'
    assert classify('aggregator', 'mul') == 'RoPE + elementwise'
    assert classify('camera_head.trunk.0.attn.qkv', 'addmm') == 'camera head'
    assert classify('depth_head.scratch', 'convolution') == 'DPT head'
    assert classify('', 'mm') == 'other'
    # [B, H, L, E] x [B, H, S, E]: QK^T and PV, 2 FLOPs per multiply-add each.
    assert attention_flops((2, 3, 5, 8), (2, 3, 7, 8), 8) == 2 * 2 * 3 * 5 * 7 * 16


def test_kernels_go_to_the_gpu_range_that_holds_them_annotations_are_not_kernels():
    def event(name, start, end, annotation=False, device=DeviceType.CUDA):
        return FunctionEvent(id=0, name=name, thread=0, start_us=start, end_us=end,
                             device_type=device, is_user_annotation=annotation)
    events = [
        event('part::norms', 0, 100, annotation=True), event('ln_kernel', 10, 40),
        event('part::cache attention', 100, 900, annotation=True),
        event('triton_attend', 110, 800), event('merge', 810, 850),
        event('part::norms', 900, 950, annotation=True), event('ln_kernel', 905, 925),
        event('stray_kernel', 960, 990),
        event('part::norms', 0, 2000, device=DeviceType.CPU),  # CPU side: ignored
    ]
    measured, total = kernel_ms_by_part(events)
    assert measured['norms'] == pytest.approx(0.050)
    assert measured['cache attention'] == pytest.approx(0.730)
    assert total == pytest.approx(0.810)  # the stray kernel is in the total, in no part
