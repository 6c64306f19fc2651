"""Write the official model's golden-formula weights to /tmp/bench_weights.safetensors, once.

Random weights for benchmarks (the same cost as the real ones, no checkpoint needed), written so
each later `bench model` only loads them. The formula runs in numpy, one tensor per process,
in a pool over the machine's cores (~1 min for 1.16 B values on 16 cores).
"""

from multiprocessing import Pool
import os
import sys

from lingbot_map_ros.engine.model.gct import LingbotMapModel
from lingbot_map_ros.engine.model.golden_weights import golden_array
from safetensors.torch import save_file
import torch

PATH = '/tmp/bench_weights.safetensors'


def one(item):
    return item[0], golden_array(item[0], item[1], 0)


def main() -> int:
    if os.path.exists(PATH):
        return 0
    with torch.device('meta'):
        shapes = [(k, tuple(v.shape)) for k, v in LingbotMapModel().state_dict().items()]
    with Pool() as pool:
        arrays = pool.map(one, shapes, chunksize=1)
    save_file({k: torch.from_numpy(a) for k, a in arrays}, PATH + '.part')
    os.replace(PATH + '.part', PATH)
    return 0


if __name__ == '__main__':
    sys.exit(main())
