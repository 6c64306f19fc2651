"""How long each unit of a rollover's prepared scale pass takes on its own (issue #24).

``engine/scale_pass.py`` cuts the next session's scale pass into units that run one
with each served frame: a DINO frame each, the aggregator's block pairs, the camera head (and
the depth heads). A frame that runs a unit launches it while the frame runs on the device, so
it pays the unit's device time (and any host time beyond the frame's). This runs the pass over
N_s synthetic frames three times on one stream of a random-weight engine and prints each
unit's time (synchronised, host and device together) and, on CUDA, the memory the last pass
holds after each unit and its peak during it.

    python3 bench/prepare_units.py                     # official model, CUDA, FP8 K/V
    python3 bench/prepare_units.py --preset tiny --device cpu --height 56 --width 56
"""

import argparse
import json
import sys
import time

from lingbot_map_ros.engine.engine import Engine
from lingbot_map_ros.tools.bench_cameras import synthetic_frames
from lingbot_map_ros.tools.bench_model import add_arguments, engine_config
import torch


def main(argv: list[str]) -> int:
    """Time every unit of three prepared scale passes; print them as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv or ['--kv-dtype', 'float8_e4m3fn'])
    engine = Engine.load(engine_config(args), None, allow_random_weights=True, seed=0)
    device = engine.device
    frames, _ = synthetic_frames(args.height, args.width, device)
    images = torch.stack(frames[:args.scale_frames])

    def sync() -> None:
        if device.type == 'cuda':
            torch.cuda.synchronize(device)

    def allocated() -> int:
        return torch.cuda.memory_allocated(device) if device.type == 'cuda' else 0

    runs, memory = [], {}
    for _ in range(3):  # the first pays one-time costs (allocations, kernel selection)
        stream = engine.open_stream()
        sync()
        base = allocated()
        scale = stream.scale_pass(images, with_depth=args.depth)
        times, held, peak = [], [], []
        while not scale.done:
            sync()
            if device.type == 'cuda':
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            scale.step()
            sync()
            times.append(round((time.perf_counter() - start) * 1e3, 2))
            if device.type == 'cuda':
                # MiB above the memory before the pass: what the pass holds after the unit
                # (its pages' lease included) and the most it held during the unit.
                held.append(round((allocated() - base) / 2**20, 1))
                peak.append(round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1))
        runs.append(times)
        memory = {'held_mib': held, 'peak_mib': peak}
        scale.cancel()
        stream.close()
    print(json.dumps({'units_ms': runs, 'scale_frames': args.scale_frames,
                      'height': args.height, 'width': args.width, 'device': str(device),
                      'with_depth': args.depth, 'last_pass_memory': memory}))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
