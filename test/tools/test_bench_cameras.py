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
"""``lingbot_map_bench model --cameras N`` on the CPU: the tiny model, a short run.

Run: ``python -m pytest test/tools/test_bench_cameras.py`` (repo root; CPU only).
"""

import json

from lingbot_map_ros.tools import bench
import pytest

# 2 scale frames, then 6 streaming ticks; sessions of 5 keyframes roll over once.
SHORT = ['model', '--preset', 'tiny', '--device', 'cpu', '--dtype', 'float32',
         '--backend', 'sdpa', '--height', '28', '--width', '42', '--frames', '8',
         '--warmup', '3', '--scale-frames', '2', '--window', '2', '--session-keyframes', '5',
         '--overlap-keyframes', '2']


def test_two_cameras_share_one_engine_and_batch_their_streaming_frames(capsys):
    assert bench.main(SHORT + ['--cameras', '2']) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result['mode'], result['cameras'], result['frames_per_camera']) == \
        ('model-cameras', 2, 8)
    # Every frame of both cameras ran: the batched ones two by two, the scale phase and
    # the rollover's alone.
    assert result['batched_frames'] == 2 * result['batches'] > 0
    assert result['batched_frames'] + result['alone_frames'] == 2 * 8
    # After its rollover each camera holds two streams (the serving one and the spare that
    # prepares the next session, docs/odometry.md); the pool is sized for exactly that.
    assert result['pool_streams'] == 4 and result['pool_pages_free'] == 0
    cams = result['per_camera']
    assert [c['camera'] for c in cams] == [0, 1]
    assert all(c['rollovers'] == 1 and c['cache']['pool_streams'] == 4 for c in cams)
    assert cams[0]['cache']['frame_count'] == cams[1]['cache']['frame_count']
    assert 'peak_gpu_memory_gib' not in result  # no CUDA: no made-up memory numbers


def test_one_camera_is_the_same_loop_without_batches(capsys):
    assert bench.main(SHORT + ['--cameras', '1']) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result['cameras'], result['batches'], result['alone_frames']) == (1, 0, 8)
    assert result['pool_streams'] == 2  # the serving stream and its rollover's spare


def test_a_negative_camera_count_is_refused():
    parser = bench.build_parser()
    args = parser.parse_args(SHORT + ['--cameras', '-1'])
    with pytest.raises(ValueError, match='--cameras -1'):
        args.run(args)


def test_profile_runs_more_batched_ticks_under_the_profiler_after_the_timed_ones(capsys):
    assert bench.main(SHORT + ['--cameras', '2', '--profile', '2']) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    result = json.loads(next(line for line in lines if line.startswith('{')))
    assert result['batched_frames'] + result['alone_frames'] == 2 * 8  # the timed ticks only
    table = out[out.index(json.dumps(result, sort_keys=True)):]
    # The operator table of the profiled ticks: the model's linear layers among its rows.
    assert 'Self CPU' in table and 'aten::linear' in table
    # The timeline: no device work on the CPU, so the ticks' time splits by host step.
    timeline = json.loads(next(line for line in lines if line.startswith('{"timeline"')))
    timeline = timeline['timeline']
    assert timeline['ticks'] == 2 and timeline['busy_ms'] == 0 and timeline['kernels'] == 0
    steps = timeline['idle_by_step_ms']
    assert {'plan', 'forward batch', 'finish'} <= set(steps)
    assert sum(steps.values()) == pytest.approx(timeline['wall_ms'], rel=0.01, abs=0.01)
