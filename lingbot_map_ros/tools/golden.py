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
"""Run a golden streaming set (``shared/golden/stream_*.safetensors`` + ``.json``) and compare.

Usage::

    lingbot_map_golden ../shared/golden/stream_B.safetensors [--dtype float64] [--backend sdpa]
    lingbot_map_golden ../shared/golden/stream_A.safetensors --device cuda --dtype bfloat16 \
        --backend flashinfer

Everything comes from the set's JSON: the weights salt (golden weights v1), the model settings
(img_size, max_frame_num, camera iterations, depth head, tap layers), the stream settings
(N_s, W, K, frame count) and the tolerances. The sequence is driven as the golden README §2.3
says: phase 1 on the N_s scale frames, then one call per frame, frame i being a keyframe iff
``K <= 1 or (i - N_s) % K == 0``, with time index = keyframes cached so far.

The tool prints the largest error of each output against its tolerance (``golden_compare.py``
judges the run); the last line is one JSON document with ``"pass"``. The exit status is 0 only
when everything passes. ``--dtype bfloat16`` runs the GPU path of spec §4.6 (bf16 aggregator
GEMMs and KV cache, float32 residual stream and heads).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
import sys
import time

from safetensors.torch import load_file
import torch

from .cli_errors import check_device, USAGE_ERRORS
from .fast_path_flags import add_fast_path_flags
from .golden_compare import compare, FP8_KV_TOLERANCES
from ..config import CacheConfig, FastPath, ModelConfig, StreamConfig
from ..engine.attention.backend import BACKEND_NAMES
from ..engine.cache import new_kv_pool, StreamKV
from ..engine.frames import NUM_SPECIAL_TOKENS, Role
from ..engine.model.gct import LingbotMapModel
from ..engine.model.golden_weights import fill_golden_weights
from ..engine.model.stream_state import StreamState
from ..engine.runner.fast_path import FastPathState
from ..engine.runner.jobs import Job
from ..engine.runner.runner import Runner
from ..kernel_config import kernel_from_json, KernelConfig

DTYPES = {'float32': torch.float32, 'float64': torch.float64, 'bfloat16': torch.bfloat16}
_LOG = logging.getLogger('lingbot_map_golden')
_PROGRESS_STEPS = 10
"""Progress lines per run (a CPU run of set B takes a minute)."""


def model_config_from_json(meta: dict) -> ModelConfig:
    """Build the model configuration a golden set was recorded with.

    Args:
        meta: the set's JSON document.

    Returns:
        The official architecture with the set's image size, time table, camera iterations,
        depth head and tap layers.

    Raises:
        ValueError: the set needs a model this package does not build (point head, no 3-D RoPE,
            another width).
    """
    model = meta['model']
    if model.get('point_head') or not model.get('enable_3d_rope', True):
        raise ValueError(f'golden set needs point_head={model.get("point_head")}, '
                         f'enable_3d_rope={model.get("enable_3d_rope")}: not supported')
    default = ModelConfig()
    return ModelConfig(img_size=model.get('img_size', default.img_size),
                       patch_size=model.get('patch_size', default.patch_size),
                       embed_dim=model.get('embed_dim', default.embed_dim),
                       max_frame_num=model.get('max_frame_num', default.max_frame_num),
                       camera_num_iterations=model.get('camera_num_iterations',
                                                       default.camera_num_iterations),
                       enable_depth=bool(model.get('depth_head', default.enable_depth)),
                       tap_layers=tuple(meta.get('tap_layers', default.tap_layers)))


def build_golden_model(config: ModelConfig, salt: int, dtype: torch.dtype,
                       device: str | torch.device = 'cpu') -> LingbotMapModel:
    """Build the model filled with golden weights v1, tensor by tensor (one model copy in memory).

    Args:
        config: model configuration.
        salt: the weights salt of the set.
        dtype: float32 or float64 (the float32 values, upcast), or bfloat16 (aggregator cast to
            bf16 after loading; the heads stay float32).
        device: where the model lives.

    Returns:
        The model in eval mode, on ``device``.

    """
    # Allocate straight in the target dtype: no float32 copy next to a float64 one.
    wide = torch.float32 if dtype == torch.bfloat16 else dtype
    model = fill_golden_weights(LingbotMapModel.empty(config, device, wide), salt)
    if dtype == torch.bfloat16:
        model.cast_aggregator(torch.bfloat16)
    return model


def _schedule(num_frames: int, num_scale: int, interval: int) -> tuple[list[bool], list[int]]:
    keyframe, time_index, count = [], [], 0
    for i in range(num_frames):
        is_key = i < num_scale or interval <= 1 or (i - num_scale) % interval == 0
        keyframe.append(is_key)
        time_index.append(i if i < num_scale else count)
        count += is_key
    return keyframe, time_index


def _cache_occupancy(kv: StreamKV, keyframe: bool) -> dict[str, int]:
    """Read the golden schedule's cache fields from the stream's cache after a call."""
    stats = kv.stats()
    attended = stats['visible_tokens']
    if not keyframe:  # the non-keyframe attended to itself too, then was rolled back
        attended += stats['page_size'] + NUM_SPECIAL_TOKENS
    return {'attended_keys_global_block': attended,
            'scale_frames_with_patches': stats['scale_pages'],
            'window_frames_with_patches': stats['live_pages'],
            'special_tokens': stats['special_tokens'], 'frames_cached': stats['frame_count']}


def drive_stream(model: LingbotMapModel, images: torch.Tensor, stream: dict, backend: str,
                 tap_frames: list[int], with_depth: bool, kv_dtype: str = 'bfloat16',
                 runner: Runner | None = None,
                 kernel: KernelConfig | None = None) -> dict[str, object]:
    """Run a whole sequence through the model as the golden README §2.3 prescribes.

    Args:
        model: the model (its parameter dtype is the working dtype).
        images: [S, 3, H, W] in [0, 1].
        stream: the set's ``stream`` section (num_scale_frames, sliding_window,
            keyframe_interval).
        backend: attention backend of the KV cache.
        tap_frames: frames whose taps and DINO tokens are kept.
        with_depth: run the depth head.
        kv_dtype: ``cache.dtype``; only 'float8_e4m3fn' changes the run (FP8 KV storage; the
            cache otherwise stores the model's dtype).
        runner: the runner to run the calls through (``Runner(model, FastPathState(...))``);
            None runs the model's eager forward.
        kernel: ``cache.kernel`` (None: the defaults).

    Returns:
        Per-frame outputs stacked over frames ('pose_enc', 'pose_enc_iters', 'depth',
        'depth_conf'), 'taps' [F, L, P, 2C] and 'dino' [F, h*w, C] of the tap frames, and the
        schedule ('keyframe_mask', 'time_index') the run used.
    """
    num_scale = min(stream['num_scale_frames'], images.shape[0])
    dtype = model.compute_dtype
    # Special-stream capacity for this sequence only (the default 2048 frames would allocate
    # gigabytes for the official width).
    cache = CacheConfig(backend=backend, scale_frames=stream['num_scale_frames'],
                        sliding_window=stream['sliding_window'],
                        max_total_frames=max(images.shape[0], stream['num_scale_frames'] + 1),
                        dtype=kv_dtype, kernel=kernel or KernelConfig())
    device = next(model.parameters()).device
    pool = new_kv_pool(model.config, cache, dtype, tuple(images.shape[-2:]), device)
    kv = StreamKV.for_cache(pool, cache)
    state = StreamState(model.new_camera_cache(), kv)
    keyframe, time_index = _schedule(images.shape[0], num_scale, stream['keyframe_interval'])
    # Images enter in the working dtype, except on the bf16 path, which takes float32 images
    # (as the session gives them) and normalises them in float32.
    images = images.to(device, torch.float32 if dtype == torch.bfloat16 else dtype)

    def call(frames: torch.Tensor, start: int, mode: Role, return_taps: bool) -> dict:
        if runner is None:
            return model(frames, start, mode, state, with_depth, return_taps)
        out = runner.run([Job(state, frames, start, mode, with_depth,
                              return_taps=return_taps)])[0][0]
        if isinstance(out, Exception):
            raise out
        return out

    outputs = [call(images[:num_scale], 0, 'scale', True)]
    frame_of = [(0, i) for i in range(num_scale)]  # (call, row) of every frame
    schedule = [_cache_occupancy(kv, True)] * num_scale
    every = max(1, images.shape[0] // _PROGRESS_STEPS)
    for i in range(num_scale, images.shape[0]):
        if i % every == 0:
            _LOG.info('frame %d of %d', i, images.shape[0])
        outputs.append(call(images[i:i + 1], time_index[i],
                            'keyframe' if keyframe[i] else 'non-keyframe', i in tap_frames))
        frame_of.append((len(outputs) - 1, 0))
        schedule.append(_cache_occupancy(kv, keyframe[i]))

    def gather(key: str, frames: list[int]) -> torch.Tensor:
        return torch.stack([outputs[frame_of[f][0]][key][frame_of[f][1]] for f in frames]).cpu()

    result: dict[str, object] = {'keyframe_mask': keyframe, 'time_index': time_index,
                                 'schedule': schedule}
    all_frames = list(range(images.shape[0]))
    for key in ('pose_enc', 'pose_enc_iters') + (('depth', 'depth_conf') if with_depth else ()):
        result[key] = gather(key, all_frames)
    result['dino'] = gather('dino_tokens', tap_frames)
    result['taps'] = torch.stack([
        torch.stack([tap[frame_of[f][1]] for tap in outputs[frame_of[f][0]]['taps']])
        for f in tap_frames]).cpu()
    return result


def resolve_set(path: str | Path) -> Path:
    """Return the set's ``.safetensors`` file; ``stream_A`` stands for ``stream_A.safetensors``.

    Raises:
        FileNotFoundError: neither exists (the message names both and the sets beside them).
    """
    path = Path(path)
    for candidate in (path, path.parent / f'{path.name}.safetensors'):
        if candidate.is_file():
            return candidate
    sets = sorted(p.name for p in path.parent.glob('*.safetensors')) \
        if path.parent.is_dir() else []
    raise FileNotFoundError(f'golden set {path} not found (nor {path.name}.safetensors); '
                            + (f'{path.parent} holds {", ".join(sets)}' if sets else
                               'give a set file such as ../shared/golden/stream_B.safetensors'))


def run_golden(set_path: str | Path, config_path: str | Path | None = None,
               dtype: str = 'float32', backend: str = 'reference',
               model: LingbotMapModel | None = None, device: str = 'cpu',
               fast_path: FastPath = 'eager', compile: bool = False,  # noqa: A002
               kv_dtype: str = 'bfloat16', camera_head_dtype: str = 'float32',
               kernel: KernelConfig | None = None) -> dict:
    """Run one golden set end to end and compare every stored output.

    Args:
        set_path: the set's ``.safetensors``.
        config_path: its JSON (default: same path with ``.json``).
        dtype: 'float32' or 'float64' (weights, activations and KV cache), or 'bfloat16' (the
            GPU path: bf16 aggregator and KV cache, float32 heads).
        backend: KV-cache attention backend ('reference' or 'sdpa' anywhere, 'flashinfer' on
            CUDA).
        model: a model already holding the set's golden weights in ``dtype`` (reused, e.g.
            across sets of one salt); None builds one.
        device: device to build the model on when ``model`` is None.
        fast_path: 'eager', 'segments' or 'whole_frame': how streaming frames run (CUDA graphs
            on CUDA, the same steps run directly on the CPU); the backend caps it.
        compile: ``torch.compile`` the fast path's fixed-shape work.
        kv_dtype: 'float8_e4m3fn' stores the KV cache in FP8, judged against
            :data:`FP8_KV_TOLERANCES`; otherwise the cache stores ``dtype``.
        camera_head_dtype: 'bfloat16' runs the camera head's trunk in bf16 (the node's
            ``stream.camera_head_dtype``; only with ``dtype='bfloat16'``).
        kernel: ``cache.kernel``, the attention kernels' tuning (None: the defaults).

    Returns:
        ``{'set', 'dtype', 'backend', 'fast_path', 'fallbacks', 'seconds', 'checks': {...},
        'pass': bool}``.

    Raises:
        ValueError: unknown dtype, or a model whose configuration or dtype does not fit the set.
    """
    set_path = resolve_set(set_path)
    config_path = Path(config_path) if config_path else set_path.with_suffix('.json')
    if dtype not in DTYPES:
        raise ValueError(f"dtype='{dtype}' is not one of {sorted(DTYPES)}")
    meta = json.loads(config_path.read_text(encoding='utf-8'))
    ref = load_file(str(set_path))
    config = model_config_from_json(meta)
    start = time.perf_counter()
    if model is None:
        _LOG.info('%s: building the model (golden weights, %s on %s)', set_path.name, dtype,
                  device)
        model = build_golden_model(config, meta['weights']['salt'], DTYPES[dtype], device)
    elif model.config != config or model.compute_dtype != DTYPES[dtype]:
        raise ValueError(f'run_golden: model ({model.compute_dtype}) does not fit set '
                         f'{set_path.name} ({dtype}, {config})')
    if camera_head_dtype == 'bfloat16' and dtype == 'bfloat16':
        model.camera_head.set_compute_dtype(torch.bfloat16)
    built = time.perf_counter()
    _LOG.info('running %d frames (backend %s)', ref['images'].shape[0], backend)
    runner = Runner(model, FastPathState(fast_path, compile))
    result = drive_stream(model, ref['images'], meta['stream'], backend,
                          ref['tap_frames'].tolist(), config.enable_depth, kv_dtype, runner,
                          kernel)
    fp8 = kv_dtype == 'float8_e4m3fn'
    checks = compare(result, ref, meta, low_precision=dtype == 'bfloat16',
                     bounds=FP8_KV_TOLERANCES if fp8 else None)
    return {'set': meta.get('set', set_path.stem), 'dtype': dtype, 'backend': backend,
            'kv_dtype': kv_dtype if fp8 else dtype,
            'camera_head_dtype': str(model.camera_head.compute_dtype).replace('torch.', ''),
            'device': str(next(model.parameters()).device),
            'compile': runner.fast_path.mode.segments_compile,
            'fast_path': runner.fast_path.mode.aggregator,
            'fallbacks': runner.fast_path.fallbacks(),
            'seconds': {'build': round(built - start, 1),
                        'run': round(time.perf_counter() - built, 1)},
            'checks': checks, 'pass': all(c['pass'] for c in checks.values())}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point ``lingbot_map_golden``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog='lingbot_map_golden',
        description='Run a golden streaming set and compare it with the stored reference.')
    parser.add_argument('set', help='golden set: its .safetensors file, or the path without '
                                    'the suffix (e.g. ../shared/golden/stream_B)')
    parser.add_argument('--config', default=None,
                        help='the set JSON (default: the .safetensors path with .json)')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='float32',
                        help='working dtype of weights, activations and KV cache')
    parser.add_argument('--backend', choices=list(BACKEND_NAMES),
                        default='reference', help='KV-cache attention backend')
    parser.add_argument('--device', default='cpu', help="torch device ('cpu', 'cuda')")
    add_fast_path_flags(parser, 'eager', "how streaming frames run (the node's "
                        'stream.fast_path): CUDA graphs on CUDA, the same steps run directly '
                        'on the CPU')
    parser.add_argument('--compile', action='store_true',
                        help="torch.compile the fast path's fixed-shape work (Inductor) first")
    parser.add_argument('--kv-dtype', choices=['bfloat16', 'float8_e4m3fn'], default='bfloat16',
                        help='float8_e4m3fn: FP8 KV cache, judged against FP8_KV_TOLERANCES')
    parser.add_argument('--camera-head-dtype', choices=['float32', 'bfloat16'],
                        default=StreamConfig.camera_head_dtype,
                        help="bfloat16: the camera head's trunk in bf16 "
                        '(stream.camera_head_dtype; with --dtype bfloat16 only)')
    parser.add_argument('--threads', type=int, default=None, help='torch CPU threads')
    parser.add_argument('--kernel', default='{}', metavar='JSON',
                        help='cache.kernel fields to replace, a JSON object (benchmarks: '
                        '\'{"triton_splits": 1}\'; docs/parameters.md)')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    _LOG.setLevel(logging.INFO)  # progress on stderr; the results go to stdout
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.dtype != 'bfloat16':
        # The set's float32 tolerances assume true float32 products: no TF32 on Ampere+ GPUs.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        check_device(args.device, '--device', 'leave --device out for the CPU')
        report = run_golden(args.set, args.config, args.dtype, args.backend, device=args.device,
                            fast_path=args.fast_path, compile=args.compile,
                            kv_dtype=args.kv_dtype, camera_head_dtype=args.camera_head_dtype,
                            kernel=kernel_from_json(args.kernel))
    except USAGE_ERRORS as exc:
        # A missing set, a device or backend this machine lacks: one line, no traceback.
        sys.stderr.write(f'lingbot_map_golden: {exc}\n')
        return 1
    for name, check in report['checks'].items():
        verdict = 'ok' if check['pass'] else 'FAIL'
        sys.stdout.write(f"{name:20s} {check['metric']:10s} {check['error']:<12.4g} "
                         f"tol {check['tol']:<10.4g} {verdict}\n")
    sys.stdout.write(json.dumps(report) + '\n')
    return 0 if report['pass'] else 1


if __name__ == '__main__':
    sys.exit(main())
