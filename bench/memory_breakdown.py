"""Where the GPU memory of a streaming session goes, phase by phase (CUDA only).

Builds a session as ``lingbot_map_bench model`` does (official model, random weights,
504x378, SDPA, compiled, CUDA graphs) and prints, after each phase, the memory allocated now,
the peak allocated during the phase and the memory reserved by the caching allocator:
weights loaded; the N_s scale frames (phase 1: KV cache allocated, dense attention over N_s
frames, the depth head on N_s frames); the first streaming frames (compile, graph capture);
the window filling; steady frames. Also the bytes of each model part's weights and of the KV
cache. The last line is one JSON document. Run on the GPU machine from the repository root:
``python3 bench/memory_breakdown.py [--depth] [--kv-dtype float8_e4m3fn] [--window 24]``.
"""

import argparse
import json
import sys

import torch

from lingbot_map_ros.config import CacheConfig, EngineConfig, ModelConfig, StreamConfig
from lingbot_map_ros.engine.pipeline import StreamingSession
from lingbot_map_ros.tools.bench_model import _stream, _synthetic_frames

GIB = 2**30


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--depth', action='store_true')
    parser.add_argument('--kv-dtype', default='bfloat16', choices=['bfloat16', 'float8_e4m3fn'])
    parser.add_argument('--window', type=int, default=64)
    parser.add_argument('--max-total-frames', type=int, default=2048)
    parser.add_argument('--weights', default=None)
    parser.add_argument('--no-compile', action='store_true')
    parser.add_argument('--device', default='cuda', help="'cpu': a dry run of the script "
                        '(tiny model, no memory numbers)')
    args = parser.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == 'cuda'
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    config = EngineConfig(
        model=ModelConfig.from_preset('official' if cuda else 'tiny'),
        cache=CacheConfig(backend='sdpa', scale_frames=8, sliding_window=args.window,
                          max_total_frames=args.max_total_frames, dtype=args.kv_dtype),
        stream=StreamConfig(device=args.device, dtype='bfloat16', image_width=504,
                            enable_depth=args.depth, fast_path='whole_frame',
                            compile=not args.no_compile))
    phases = []

    def mark(name):
        if cuda:
            torch.cuda.synchronize(dev)
        phases.append({'phase': name,
                       'allocated_gib': round(torch.cuda.memory_allocated(dev) / GIB, 3),
                       'peak_gib': round(torch.cuda.max_memory_allocated(dev) / GIB, 3),
                       'reserved_gib': round(torch.cuda.memory_reserved(dev) / GIB, 3)}
                      if cuda else {'phase': name, 'allocated_gib': 0.0, 'peak_gib': 0.0,
                                    'reserved_gib': 0.0})
        print(f"{name:34s} allocated {phases[-1]['allocated_gib']:7.3f} GiB  peak "
              f"{phases[-1]['peak_gib']:7.3f}  reserved {phases[-1]['reserved_gib']:7.3f}",
              flush=True)
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)

    session = StreamingSession(config, args.weights, allow_random_weights=args.weights is None)
    mark('weights loaded')
    frames, info = _synthetic_frames(378, 504, dev) if cuda else _synthetic_frames(56, 84, dev)
    _stream(session, frames, info, 8, dev)
    mark('8 scale frames (phase 1)')
    _stream(session, frames, info, 2, dev)
    mark('first 2 streaming frames')
    _stream(session, frames, info, args.window, dev)
    mark(f'window filled (+{args.window})')
    _stream(session, frames, info, 30, dev)
    mark('30 steady frames')
    model = session.model
    weights = {name: round(sum(p.numel() * p.element_size() for p in part.parameters()) / GIB, 3)
               for name, part in model.named_children()}
    stats = session.stream.state.kv.stats()
    result = {'phases': phases, 'weights_gib': weights,
              'kv_gib': round(stats['kv_bytes'] / GIB, 3), 'kv_dtype': stats['dtype'],
              'window': args.window, 'max_total_frames': args.max_total_frames,
              'depth': args.depth}
    print(json.dumps(result))
    return 0


if __name__ == '__main__':
    sys.exit(main())
