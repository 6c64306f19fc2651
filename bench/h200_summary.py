"""Collect one STAGE=issue13 run of bench/run_h200.sh into ``h200_summary.json`` (and print it).

Reads the last (JSON) line of each ``model_*.txt`` of the run folder and of
``attention_kernels.txt``, ``golden_A_fp8_kv.txt`` and ``memory_fp8_depth.txt``.
Steady FPS = 1000 / the mean ms of the last report window.
Usage: ``python3 bench/h200_summary.py RUN_FOLDER``.
"""

import json
import os
import subprocess
import sys


def last_json(path):
    """The last line of ``path`` that parses as a JSON object, or None."""
    try:
        lines = open(path, encoding='utf-8').read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith('{'):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def model_entry(doc):
    if not doc:
        return None
    ms = doc.get('ms_last_window')
    cache = doc.get('cache') or {}
    return {'fps_steady': round(1000 / ms, 2) if ms else None,
            'ms_last_window': ms, 'peak_gpu_memory_gib': doc.get('peak_gpu_memory_gib'),
            'kv_gib': round(cache['kv_bytes'] / 2**30, 3) if 'kv_bytes' in cache else None,
            'window': doc.get('window'), 'kv_dtype': cache.get('dtype'),
            'max_total_frames': cache.get('max_total_frames')}


def commit():
    try:
        return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get('COMMIT', 'unknown')


def main():
    run = sys.argv[1] if len(sys.argv) > 1 else 'bench/results/raw'
    models = {name: model_entry(last_json(os.path.join(run, f'model_{name}.txt')))
              for name in ('default_pose', 'default_depth', 'small_gpu_depth')}
    memory = last_json(os.path.join(run, 'memory_fp8_depth.txt'))
    attention = last_json(os.path.join(run, 'attention_kernels.txt')) or {}
    golden = last_json(os.path.join(run, 'golden_A_fp8_kv.txt')) or {}
    pose, depth = models['default_pose'] or {}, models['default_depth'] or {}
    summary = {
        'pose_fps_steady': pose.get('fps_steady'),
        'depth_fps_steady': depth.get('fps_steady'),
        'peak_gpu_memory_gib': depth.get('peak_gpu_memory_gib'),
        'attention_tflops': attention.get('attention_tflops'),
        'attention_fastest': attention.get('attention_fastest'),
        'triton_best': attention.get('triton_best'),
        'golden_A_fp8_kv_pass': golden.get('pass'),
        'golden_A_fp8_kv': {k: v.get('error') for k, v in golden.get('checks', {}).items()},
        'models': models,
        'memory_fp8_depth_330': memory,
        'commit': commit(),
    }
    with open(os.path.join(run, 'h200_summary.json'), 'w', encoding='utf-8') as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == '__main__':
    sys.exit(main())
