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
"""``lingbot_map_bench fidelity``: every path this device runs, judged by a long fidelity set.

What and why: the speed of a cache backend, K/V dtype or fast path means nothing if it moves the
poses away from the official model. A fidelity set (``shared/golden/long/``, judged by
``fidelity_gate.py``) holds the official fp32 outputs over a long real sequence and the official
bf16 run's errors; this tool runs the node's own engine path (a ``StreamingSession`` built from
the parameter file, as the node builds it) with the set's golden weights over the set's frames:
first the file's own configuration (``default``), then every combination of

* ``fast_path`` (``stream.fast_path`` and ``stream.compile`` together),
* ``stream.camera_head_dtype`` (on CUDA with a bf16 ``stream.dtype``),
* ``cache.precision`` (every value of its ``Literal``, when the field exists),
* ``cache.backend`` (every concrete backend; ``auto`` only through ``default``),
* ``cache.dtype`` (float8_e4m3fn, bfloat16)

(``fidelity_combos.py``; ``--combos`` and ``--axis`` choose others), and prints each
combination's six errors, their ratios to the official bf16 run's, pass/fail and one JSON line.
A combination the device or the configuration refuses (a CUDA backend on the CPU, FP8 K/V with
FlashInfer, ``fa3`` without its wheel) is reported as skipped, with the reason. Combinations run
one after another, each engine freed before the next; ``--json-out`` is rewritten after each,
``--resume`` goes on from it and ``--budget-s`` stops in time (calls under a time limit).

From the set's JSON: golden weights salt, model (the demo build, depth head on; or the set's
``model`` block), processed size (``stream.image_width`` = the frames' width: frames are fed as
they are, RGB uint8 / 255), N_s, W, K and camera iterations. Frames are PNGs from
``--frames-dir`` or the set's ``inputs.folder``, found beside the set or above it.

The golden weights are generated once per run into a ``.safetensors`` file (``--weights-cache``
keeps it for the next run) and each combination loads it as the node loads a checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
from pathlib import Path
import tempfile
import time
from typing import Any

from lingbot_map_ros.config import EngineConfig, load_yaml
from lingbot_map_ros.engine.errors import NonFiniteOutputError
from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
from lingbot_map_ros.engine.session.pipeline import StreamingSession
from lingbot_map_ros.tools.config_files import find_config, parse_set
from lingbot_map_ros.tools.fidelity_combos import combinations, combo_label, combo_parameters, \
    default_axes, parse_axes, parse_combo, precheck
from lingbot_map_ros.tools.fidelity_gate import ERROR_NAMES, fidelity_errors, FidelitySet, \
    judge, load_set, verdict_lines
from lingbot_map_ros.tools.fidelity_inputs import frames_folder, golden_weights_file, \
    load_frames, model_config_for_set, set_overrides
import numpy as np
import torch

_REFUSALS = (ValueError, ImportError, NotImplementedError)
"""What the engine raises for a combination it will not run here (the message says why)."""
_FRAME_PERIOD_NS = 33_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags of the ``fidelity`` subcommand to ``parser``."""
    parser.add_argument('--set', dest='fidelity_set', required=True,
                        help='the fidelity set: DIR/stream_X (its .json and .safetensors), e.g. '
                             '../shared/golden/long/stream_D')
    parser.add_argument('--frames-dir', default=None,
                        help="folder of the set's PNGs (default: the JSON's inputs.folder, "
                             'looked for beside the set and in every folder above it)')
    parser.add_argument('--config', default=None,
                        help='parameter file the engine is built from (default: the shipped '
                             'config/lingbot_map.yaml); the set overrides model, N_s, W, K, '
                             'image width and depth')
    parser.add_argument('--device', default=None,
                        help="torch device (default: the file's stream.device)")
    parser.add_argument('--param', action='append', default=[], metavar='KEY=VALUE',
                        help='override one parameter of the file for every combination '
                             '(repeatable), e.g. --param stream.device=cpu')
    parser.add_argument('--combos', nargs='+', default=None, metavar='SPEC',
                        help="run only these combinations: each 'KEY=VALUE,KEY=VALUE' (axes as "
                             "--list shows them; keys left out keep the file's value), or "
                             "'default' for the file as it is")
    parser.add_argument('--axis', action='append', default=[], metavar='KEY=V1,V2',
                        help='the values of one axis of the sweep (repeatable); e.g. '
                             '--axis cache.backend=triton,fa3 or --axis fast_path=eager')
    parser.add_argument('--list', action='store_true',
                        help='print the combinations and exit (nothing runs)')
    parser.add_argument('--json-out', default=None, metavar='FILE',
                        help='write every result to FILE (rewritten after each combination)')
    parser.add_argument('--resume', action='store_true',
                        help='with --json-out: keep the results FILE already holds and run only '
                             'the combinations it lacks (several calls under a time limit)')
    parser.add_argument('--budget-s', type=float, default=0.0, metavar='S',
                        help='start no combination that would end past S seconds (judged by '
                             'the longest so far); with --json-out and --resume a later call '
                             'goes on (0: no limit)')
    parser.add_argument('--weights-cache', default=None, metavar='FILE.safetensors',
                        help='keep the generated golden weights here and reuse them in later '
                             'runs (default: a temporary file, deleted at the end)')


# ---- one combination -------------------------------------------------------------------------

@dataclasses.dataclass
class _Outputs:
    """The run's outputs, filled frame by frame (a failure keeps what came out)."""

    pose_enc: np.ndarray
    depth: np.ndarray
    frames_out: int = 0


def _feed(session: StreamingSession, frames: torch.Tensor, fset: FidelitySet,
          out: _Outputs) -> None:
    """Feed every frame as the node would after preprocessing; keep pose and strided depth."""
    height, width = fset.size_hw
    info = PreprocessInfo(original_size_hw=(height, width), resized_size_hw=(height, width),
                          image_size_hw=(height, width), crop_top=0)
    step = fset.depth_stride

    def keep(preds: list) -> None:
        for pred in preds:
            out.pose_enc[pred.frame_index] = pred.pose_enc
            out.depth[pred.frame_index] = pred.depth[::step, ::step].float().cpu().numpy()
            out.frames_out += 1

    for i in range(frames.shape[0]):
        keep(session.step_tensor(frames[i], info, i * _FRAME_PERIOD_NS))
    keep(session.flush())  # a sequence shorter than N_s
    if out.frames_out != frames.shape[0]:
        raise RuntimeError(f'{out.frames_out} predictions for {frames.shape[0]} frames')


def _in_effect(session: StreamingSession) -> dict[str, Any]:
    """Return what the engine ran: the resolved backend, K/V dtype, precision, fast path."""
    stats = session.stats()
    cache = stats.cache
    return {'backend': cache.backend if cache else stats.backend,
            'kv_dtype': cache.dtype if cache else None,
            'precision': getattr(cache, 'precision', None),
            'compute_dtype': stats.dtype, 'fast_path': stats.fast_path,
            'compiled': stats.compiled, 'fast_path_fallbacks': stats.fast_path_fallbacks}


def _release(session: StreamingSession | None, compiled: bool) -> None:
    """Free an engine before the next combination is built (weights, graphs, pool)."""
    if session is not None:
        session.close()
    del session
    gc.collect()
    if compiled:
        torch._dynamo.reset()  # compiled graphs hold the model's weights
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_combo(base: dict[str, Any], combo: dict[str, Any], fset: FidelitySet,
              frames: torch.Tensor, weights: Path) -> dict[str, Any]:
    """Run one combination over the set's frames and judge it.

    Returns:
        ``{'combo', 'errors', 'ratios', 'worst_ratio', 'failed', 'pass', 'seconds', ...}``;
        a combination refused before its first output: ``{'combo', 'skipped': reason,
        'pass': None}``; one that broke later: ``'error'`` and ``'pass': False``.
    """
    flat = {**base, **combo_parameters(combo)}
    result: dict[str, Any] = {'combo': combo}
    reason = precheck(flat)
    if reason is not None:
        return {**result, 'skipped': reason, 'pass': None}
    cuda = str(flat.get('stream.device')).startswith('cuda')
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out = _Outputs(np.full((fset.num_frames, 9), np.nan),
                   np.full((fset.num_frames, *fset.depth.shape[1:]), np.nan, np.float32))
    session = None
    compiled = bool(flat.get('stream.compile'))
    start = time.perf_counter()
    try:
        session = StreamingSession(EngineConfig.from_flat(flat), weights)
        _feed(session, frames, fset, out)
        result['in_effect'] = _in_effect(session)
    except NonFiniteOutputError as exc:  # a failed run, judged as such
        result['note'] = str(exc)
    except _REFUSALS as exc:
        if out.frames_out == 0:
            _release(session, compiled)
            return {**result, 'skipped': f'{type(exc).__name__}: {exc}', 'pass': None}
        result.update(error=f'{type(exc).__name__}: {exc}', frames_out=out.frames_out)
    except RuntimeError as exc:  # CUDA out of memory, a kernel that failed
        result.update(error=f'{type(exc).__name__}: {exc}', frames_out=out.frames_out)
    finally:
        seconds = time.perf_counter() - start
        _release(session, compiled)
        session = None
    verdict = judge(fidelity_errors(out.pose_enc, out.depth, fset), fset.meta)
    result.update(errors=verdict.errors, ratios=verdict.ratios,
                  worst_ratio=verdict.worst_ratio, failed=list(verdict.failed),
                  seconds=round(seconds, 1))
    result['pass'] = verdict.passed and 'error' not in result
    result['lines'] = verdict_lines(verdict)
    if cuda:
        result['peak_gpu_memory_gib'] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return result


# ---- the sweep -------------------------------------------------------------------------------

def base_parameters(args: argparse.Namespace, fset: FidelitySet) -> dict[str, Any]:
    """Return the flat engine parameters every combination starts from.

    The parameter file's model/cache/stream keys, then ``--param``, ``--device``, then what
    the set fixes.
    """
    path = args.config or find_config('lingbot_map.yaml')
    flat = {k: v for k, v in load_yaml(path).items()
            if k.partition('.')[0] in ('model', 'cache', 'stream')}
    flat.update(parse_set(args.param))
    if args.device:
        flat['stream.device'] = args.device
    flat.update(set_overrides(fset))
    return flat


def _json_safe(value: Any) -> Any:
    """Return ``value`` with non-finite floats as None, so the JSON lines stay strict JSON."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _report_line(result: dict[str, Any]) -> str:
    keys = ('combo', 'errors', 'ratios', 'worst_ratio', 'pass', 'seconds', 'failed', 'skipped',
            'error', 'note', 'in_effect', 'peak_gpu_memory_gib')
    return json.dumps(_json_safe({k: result[k] for k in keys if k in result}))


def _print_result(result: dict[str, Any]) -> None:
    if 'skipped' in result:
        print(f"  skipped: {result['skipped']}", flush=True)
    else:
        for line in result['lines']:
            print(line)
        for key in ('error', 'note'):
            if key in result:
                print(f'  {key}: {result[key]}')
        verdict = 'PASS' if result['pass'] else 'FAIL ' + ', '.join(result['failed'])
        print(f"  {verdict} (worst x{result['worst_ratio']:.3f}) in {result['seconds']} s",
              flush=True)
    print(_report_line(result), flush=True)


def _number(value: float | None) -> float:
    """Return a ratio read back from JSON (None stands for infinity: :func:`_json_safe`)."""
    return float('inf') if value is None else float(value)


def _print_table(results: list[dict[str, Any]]) -> None:
    """Print one row per combination: verdict, worst ratio and every ratio."""
    labels = [combo_label(r['combo']) for r in results]
    width = max([len(label) for label in labels] + [11])
    names = ' '.join(f'{n:>16s}' for n in ERROR_NAMES)
    print(f"{'combination':<{width}}  verdict  worst  {names}")
    for label, r in zip(labels, results):
        if 'skipped' in r:
            print(f"{label:<{width}}  skipped  {r['skipped'][:100]}")
            continue
        ratios = ' '.join(f"{_number(r['ratios'].get(n)):>16.3f}" for n in ERROR_NAMES)
        verdict = 'pass' if r['pass'] else ('error' if 'error' in r else 'FAIL')
        print(f"{label:<{width}}  {verdict:<7s}  {_number(r['worst_ratio']):<5.2f}  {ratios}")


def _previous(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Return the results ``--json-out`` already holds (``--resume``), errors left out.

    With ``--resume`` the file keeps them: this call's combinations first, then the others.
    """
    if not (args.resume and args.json_out and Path(args.json_out).is_file()):
        return []
    document = json.loads(Path(args.json_out).read_text(encoding='utf-8'))
    return [r for r in document.get('results', []) if 'error' not in r]


def _write(path: str | None, header: dict[str, Any], results: list[dict[str, Any]]) -> None:
    if path:
        rows = [json.loads(_report_line(r)) for r in results]
        Path(path).write_text(json.dumps({**header, 'results': rows}, indent=1) + '\n',
                              encoding='utf-8')


def sweep_combos(args: argparse.Namespace, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the combinations to run: ``--combos``, else the file as it is, then the sweep."""
    if args.combos:
        return [parse_combo(spec) for spec in args.combos]
    return [{}] + combinations(parse_axes(args.axis, default_axes(base)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the sweep described by ``args``; print per combination and a table; return a dict.

    The dict's ``pass`` is True when at least one combination ran and every one that ran
    passed.
    """
    start = time.perf_counter()
    fset = load_set(args.fidelity_set)
    base = base_parameters(args, fset)
    combos = sweep_combos(args, base)
    if args.list:
        for combo in combos:
            print(combo_label(combo))
        return {'combos': combos}
    frames = load_frames(fset, frames_folder(fset, args.frames_dir))
    header = {'set': fset.name, 'frames': fset.num_frames, 'torch': torch.__version__,
              'device': base.get('stream.device'),
              'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    done = _previous(args)
    others = [r for r in done if r['combo'] not in combos]  # kept in the file, not run here
    results: list[dict[str, Any]] = []
    longest = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        weights = golden_weights_file(model_config_for_set(fset.meta),
                                      int(fset.meta['weights']['salt']),
                                      Path(args.weights_cache or Path(tmp) / 'golden.safetensors'))
        for i, combo in enumerate(combos):
            print(f'[{i + 1}/{len(combos)}] {combo_label(combo)}', flush=True)
            kept = [r for r in done if r['combo'] == combo]
            if kept:
                print('  kept from', args.json_out)
                results.append(kept[0])
                _write(args.json_out, header, results + others)
                continue
            if args.budget_s and time.perf_counter() - start + longest > args.budget_s:
                print(f'  budget: {len(combos) - i} combination(s) not run; run again with '
                      '--json-out FILE --resume to go on', flush=True)
                break
            result = run_combo(base, combo, fset, frames, weights)
            longest = max(longest, result.get('seconds', 0.0))
            _print_result(result)
            results.append(result)
            _write(args.json_out, header, results + others)
    ran = [r for r in results if 'skipped' not in r]
    _print_table(results)
    summary = {**header, 'combinations': len(combos), 'ran': len(ran),
               'not_run': len(combos) - len(results),
               'pass': bool(ran) and all(r['pass'] for r in ran)}
    print(json.dumps(summary))
    return summary
