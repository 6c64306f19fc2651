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
r"""Each emulated 8-bit design's attention error on one frame's real cache inputs (issue #44).

A probe, not the gate: it runs the official model (the set's golden weights, float32, ``sdpa``,
eager) over the first ``--frames`` frames of a fidelity set, keeps the last frame's queries,
keys and values of the chosen global layers as the cache hands them to the backend, and gives
each design of ``bench/quant_emulation.py`` (plus single-term variants that isolate the Q.K,
P, V and accumulation terms) its relative L2 error against float64 attention. Runs on the CPU
(a few minutes for 16 frames), so it answers "which term dominates" where no GPU is at hand;
whether a design passes is for ``bench/emulated_fidelity.py`` on the GPU.

    python bench/emulated_layer_errors.py --set ../shared/golden/long/stream_D \\
        --frames-dir ../shared/data/loop --frames 16 --layers 0,8,16,23 --json-out F
"""

import argparse
import dataclasses
import json
import math
from pathlib import Path
import sys
import tempfile
import time

from quant_emulation import emulated_attention, Recipe, RECIPES
import torch

PROBES: dict[str, Recipe] = {
    **RECIPES,
    'qk_int8_only': Recipe(p_format='exact', v_format='exact'),
    'qk_int8_no_mean': Recipe(key_mean=False, p_format='exact', v_format='exact'),
    'qk_e4m3_row': Recipe(qk='exact', key_mean=False, p_format='exact', v_format='exact'),
    'p_e4m3_only': Recipe(qk='exact', key_mean=False, v_format='exact'),
    'v_e4m3_only': Recipe(qk='exact', key_mean=False, p_format='exact'),
    'one_level_only': Recipe(qk='exact', key_mean=False, p_format='exact', v_format='exact',
                             accumulation='one_level'),
}
"""The issue's rows and one-term probes ('qk_e4m3_row' is a placeholder filled below)."""


def _e4m3_rows(x: torch.Tensor) -> torch.Tensor:
    """Round ``[Q, H, D]`` to e4m3 with one scale per row and head (the one-term FP8 queries)."""
    amax = x.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    return (x / amax * 448.0).to(torch.float8_e4m3fn).to(torch.float32) * amax / 448.0


class Recorder:
    """A backend wrapper that keeps the inputs of the last call of each chosen layer."""

    def __init__(self, inner: object, layers: list[int], num_layers: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.graph_support = 'segments'
        self.fallbacks = 0
        self.layers = layers
        self.num_layers = num_layers
        self.calls = 0
        self.kept: dict[int, tuple[torch.Tensor, ...]] = {}
        from lingbot_map_ros.engine.attention.page_gather import PageGather
        self._gather = PageGather()

    def staged_attention(self, *args: object) -> None:
        """Return None: no capturable form."""
        return None

    def plan(self, layout: object, num_queries: int) -> None:
        """Plan the inner backend."""
        self.inner.plan(layout, num_queries)

    def run(self, q, k_pages, v_pages, layout):
        """Keep a chosen layer's inputs, then attend through the inner backend."""
        layer = self.calls % self.num_layers
        self.calls += 1
        if layer in self.layers:
            k = self._gather(k_pages, layout).float().clone()
            v = self._gather(v_pages, layout).float().clone()
            scale = min(layout.num_scale_pages * layout.page_size, k.shape[0])
            mean = (k[:scale] if scale else k).mean(0)
            self.kept[layer] = (q.float().clone(), k, v, mean)
        return self.inner.run(q, k_pages, v_pages, layout)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main(argv: list[str]) -> int:
    """Run the probe; print a table and one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--set', required=True)
    parser.add_argument('--frames-dir', default=None)
    parser.add_argument('--frames', type=int, default=16)
    parser.add_argument('--layers', default='0,8,16,23')
    parser.add_argument('--json-out', default=None)
    parser.add_argument('--weights-cache', default=None,
                        help='keep the generated golden weights here for the next run')
    args = parser.parse_args(argv)
    from lingbot_map_ros.config import EngineConfig
    from lingbot_map_ros.engine.cache import kv_pool
    from lingbot_map_ros.engine.image.preprocess import PreprocessInfo
    from lingbot_map_ros.engine.session.pipeline import StreamingSession
    from lingbot_map_ros.tools import fidelity
    from lingbot_map_ros.tools.fidelity_gate import load_set
    from lingbot_map_ros.tools.fidelity_inputs import frames_folder, golden_weights_file, \
        load_frames, model_config_for_set

    torch.backends.cuda.matmul.allow_tf32 = False
    layers = [int(x) for x in args.layers.split(',')]
    fset = load_set(args.set)
    ns = argparse.Namespace(config=None, param=['stream.device=cpu', 'cache.backend=sdpa',
                                                'cache.dtype=float32', 'stream.dtype=float32',
                                                'stream.fast_path=eager',
                                                'stream.compile=false'], device='cpu')
    flat = fidelity.base_parameters(ns, fset)
    flat['stream.enable_depth'] = False  # the probe needs the cache inputs only
    # A pool for these frames only (float32 K/V of the set's whole length would take ~20 GB).
    window = max(1, args.frames - int(flat['cache.scale_frames']))
    flat.update({'cache.sliding_window': window, 'cache.max_total_frames': args.frames + 1,
                 'stream.session_keyframes': args.frames + 1})
    config = model_config_for_set(fset.meta)
    recorders: list[Recorder] = []
    original = kv_pool.make_backend

    def make_backend(name, **kwargs):
        rec = Recorder(original(name, **kwargs), layers, config.depth)
        recorders.append(rec)
        return rec

    kv_pool.make_backend = make_backend
    frames = load_frames(fset, frames_folder(fset, args.frames_dir))[:args.frames]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        weights = golden_weights_file(config, int(fset.meta['weights']['salt']),
                                      Path(args.weights_cache or Path(tmp) / 'golden.safetensors'))
        session = StreamingSession(EngineConfig.from_flat(flat), weights)
        height, width = fset.size_hw
        info = PreprocessInfo(original_size_hw=(height, width), resized_size_hw=(height, width),
                              image_size_hw=(height, width), crop_top=0)
        for i in range(frames.shape[0]):
            session.step_tensor(frames[i], info, i * 33_000_000)
        session.flush()
    model_s = time.perf_counter() - start
    kept = recorders[-1].kept
    result = {'set': fset.name, 'frames': int(frames.shape[0]), 'model_seconds': round(model_s),
              'probes': {n: dataclasses.asdict(r) for n, r in PROBES.items()}, 'layers': {}}
    for layer in layers:
        q, k, v, mean = kept[layer]
        qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k, v))
        ref = (torch.softmax(qd @ kd.transpose(1, 2) / math.sqrt(q.shape[-1]), -1) @ vd)
        ref = ref.transpose(0, 1)
        row = {'queries': q.shape[0], 'keys': k.shape[0],
               'key_mean_over_key_rms': float(mean.norm() / k.pow(2).mean(0).sum(-1).sqrt()
                                              .mean())}
        for name, recipe in PROBES.items():
            qq = _e4m3_rows(q) if name == 'qk_e4m3_row' else q
            out = emulated_attention(qq, k, v, recipe, key_mean=mean, heads_per_pass=2)
            row[name] = _rel(out, ref)
        result['layers'][layer] = row
        print(layer, json.dumps(row), flush=True)
    names = list(PROBES)
    print('layer  keys   ' + '  '.join(f'{n:>15}' for n in names))
    for layer, row in result['layers'].items():
        print(f'{layer:>5}  {row["keys"]:>5}  ' + '  '.join(f'{row[n]:15.3e}' for n in names))
    print(json.dumps(result))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + '\n', encoding='utf-8')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
