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
"""Every console script of setup.py answers --help, and runs or refuses cleanly without a GPU.

Issue #38: a new user's first commands. Each script runs as its own process (the entry point of
setup.py, with this interpreter), so what is checked is what a terminal shows: exit status 0 and
plain text for ``--help`` (no Sphinx markup), and on a machine without CUDA one line and exit
status 1 for a command that needs a GPU, never a traceback. Run:
``pytest test/tools/test_console_scripts.py`` (~1 min: each process imports torch).
"""

from __future__ import annotations

from pathlib import Path
import re
import subprocess
import sys

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT.parent / 'shared' / 'golden' / 'stream_A'


def console_scripts() -> dict[str, str]:
    """``{name: 'module:function'}`` of setup.py's console scripts."""
    text = (ROOT / 'setup.py').read_text(encoding='utf-8')
    return dict(re.findall(r"'(lingbot_map_\w+) = ([\w.]+:\w+)'", text))


def script(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run console script ``name`` as pip's wrapper does: ``sys.argv[0]`` is its name."""
    module, _, function = console_scripts()[name].partition(':')
    code = (f'import sys\nsys.argv[0] = {name!r}\nfrom {module} import {function}\n'
            f'sys.exit({function}())\n')
    return subprocess.run([sys.executable, '-c', code, *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def one_line_refusal(result: subprocess.CompletedProcess, *words: str) -> str:
    """Check exit status 1, no traceback, and one line holding every one of ``words``."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert 'Traceback' not in output, output
    lines = [line for line in output.splitlines() if all(w in line for w in words)]
    assert len(lines) == 1, output
    return lines[0]


def test_setup_lists_the_documented_scripts():
    assert set(console_scripts()) == {
        'lingbot_map_node', 'lingbot_map_lifecycle_node', 'lingbot_map_launch',
        'lingbot_map_replay', 'lingbot_map_bench', 'lingbot_map_golden', 'lingbot_map_convert',
        'lingbot_map_demo'}


@pytest.mark.parametrize('name', sorted(console_scripts()))
def test_help_is_plain_text(name):
    result = script(name, '--help')
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert f'usage: {name}' in text
    for markup in ('``', ':mod:', ':class:', ':func:', ':data:'):
        assert markup not in text, f'{name} --help shows {markup}'


@pytest.mark.parametrize('sub', ['cache', 'model', 'map', 'memory', 'fidelity'])
def test_bench_subcommand_help(sub):
    bench = (ROOT / 'lingbot_map_ros' / 'tools' / 'bench.py').read_text(encoding='utf-8')
    if sub == 'fidelity' and 'fidelity' not in bench:
        pytest.skip('no fidelity subcommand in this tree')
    result = script('lingbot_map_bench', sub, '--help')
    assert result.returncode == 0, result.stderr
    assert '``' not in result.stdout and ':mod:' not in result.stdout


needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason='checks the CPU-only answer')


@needs_no_gpu
def test_bench_memory_refuses_the_gpu_config_in_one_line():
    line = one_line_refusal(script('lingbot_map_bench', 'memory'), 'no CUDA')
    assert 'demo_tiny_cpu.yaml' in line  # says how to run the CPU dry run


@needs_no_gpu
def test_bench_model_refuses_cuda_in_one_line():
    one_line_refusal(script('lingbot_map_bench', 'model', '--frames', '2'), 'CUDA')


def test_bench_memory_refuses_an_unknown_set_key():
    line = one_line_refusal(script('lingbot_map_bench', 'memory', '--config',
                                   'demo_tiny_cpu.yaml', '--set', 'cache.scale_frame=3'),
                            "unknown parameter 'cache.scale_frame'")
    assert 'did you mean cache.scale_frames?' in line


@pytest.mark.slow
def test_bench_memory_cpu_dry_run(tmp_path):
    result = script('lingbot_map_bench', 'memory', '--config', 'demo_tiny_cpu.yaml',
                    '--steady', '1', '--height', '42', '--width', '56')
    assert result.returncode == 0, result.stderr
    import json
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report['gpu'] is None and report['peak_allocated_gib'] is None
    phases = [p['phase'] for p in report['phases']]
    assert phases == ['weights', 'warm-up/capture', 'phase 1', 'streaming', 'rollover']
    assert report['rollovers'] == 1


@needs_no_gpu
def test_golden_refuses_cuda_in_one_line():
    if not GOLDEN.with_suffix('.safetensors').is_file():
        pytest.skip('no golden sets beside the checkout')
    one_line_refusal(script('lingbot_map_golden', str(GOLDEN), '--device', 'cuda'), 'no CUDA')


def test_golden_names_a_missing_set_in_one_line(tmp_path):
    line = one_line_refusal(script('lingbot_map_golden', str(tmp_path / 'stream_Z')),
                            'not found')
    assert 'stream_Z.safetensors' in line


def test_launch_refuses_an_unknown_argument_in_one_line():
    pytest.importorskip('launch_ros')
    line = one_line_refusal(script('lingbot_map_launch', 'image_topc:=/cam/image_raw'),
                            "unknown launch argument 'image_topc'")
    assert 'did you mean image_topic?' in line


def test_convert_names_a_missing_checkpoint_in_one_line(tmp_path):
    one_line_refusal(script('lingbot_map_convert', str(tmp_path / 'none.pt'),
                            str(tmp_path / 'out.safetensors')), 'does not exist')


def test_make_bag_prints_what_it_wrote(tmp_path):
    result = script('lingbot_map_replay', 'make-bag', '--synthetic', '--cameras', '2',
                    '--frames', '3', '--size', '64x48', '--out', str(tmp_path / 'rig'))
    assert result.returncode == 0, result.stderr
    for topic in ('/cam_0/image_raw', '/cam_1/image_raw', '/cam_0/camera_info'):
        assert f'  {topic} [sensor_msgs/msg/' in result.stderr, result.stderr
    assert f"ground truth of camera 1: {tmp_path / 'rig'}_gt_cam1.tum" in result.stderr
