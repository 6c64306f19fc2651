"""How long each unit of a rollover's prepared scale pass takes on its own (issue #24).

``engine/session/scale_steps.py`` cuts the next session's scale pass into units that run one
after each served frame: a DINO frame each, the aggregator's block pairs, the camera head (and
the depth heads). A frame that runs a unit costs that unit on top of itself, so the heaviest
unit sets ``max_streaming_over_median``. This runs the pass over N_s synthetic frames three
times on one stream of a random-weight engine and prints each unit's time (synchronised).

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

    runs = []
    for _ in range(3):  # the first pays one-time costs (allocations, kernel selection)
        stream = engine.open_stream()
        scale = stream.scale_pass(images, with_depth=args.depth)
        times = []
        while not scale.done:
            sync()
            start = time.perf_counter()
            scale.step()
            sync()
            times.append(round((time.perf_counter() - start) * 1e3, 2))
        runs.append(times)
        scale.cancel()
        stream.close()
    print(json.dumps({'units_ms': runs, 'scale_frames': args.scale_frames,
                      'height': args.height, 'width': args.width, 'device': str(device)}))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
