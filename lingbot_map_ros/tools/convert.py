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
"""Convert an official LingBot-Map checkpoint (``.pt``) to a checked ``.safetensors`` file.

Usage::

    lingbot_map_convert lingbot-map-long.pt lingbot-map-long.safetensors

The input is read with ``torch.load(weights_only=True)`` unless ``--allow-pickle`` is given (only
for trusted files that also pickle non-tensor objects). A ``{"model": state_dict}`` wrapper is
unwrapped and ``point_head.*`` is dropped. By default the names and shapes are checked against
the model (the official one, or ``--preset tiny``) on the 'meta' device, so the check allocates
no weights. The output holds contiguous tensors with their original dtype.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
import sys

from safetensors.torch import save_file
import torch

from ..config import ModelConfig
from ..engine.errors import WeightsError
from ..engine.model.gct import LingbotMapModel
from ..engine.model.weights import check_state_dict, drop_ignored, load_checkpoint

logger = logging.getLogger(__name__)


def convert(src: str | Path, dst: str | Path, check: bool = True, preset: str = 'official',
            allow_pickle: bool = False) -> int:
    """Convert ``src`` to ``dst`` (safetensors).

    Args:
        src: checkpoint to read (.pt/.pth/.bin/.ckpt or .safetensors).
        dst: ``.safetensors`` file to write.
        check: check names and shapes against the model of ``preset``.
        preset: 'official' or 'tiny' (``ModelConfig.preset``).
        allow_pickle: read a torch file with ``weights_only=False`` (trusted files only).

    Returns:
        The number of tensors written.

    Raises:
        ValueError: ``dst`` does not end with ``.safetensors``, or an unknown preset.
        WeightsError: unreadable checkpoint, or a name/shape mismatch with ``check``.
    """
    dst = Path(dst)
    if dst.suffix != '.safetensors':
        raise ValueError(f'output {dst} must end with .safetensors')
    state_dict = drop_ignored(load_checkpoint(src, allow_pickle=allow_pickle))
    if check:
        with torch.device('meta'):
            model = LingbotMapModel(ModelConfig.from_preset(preset))
        check_state_dict(model, state_dict)
    # safetensors refuses shared or strided storage: write plain contiguous copies
    tensors = {k: v.detach().contiguous().clone() if _shares_storage(v) else
               v.detach().contiguous() for k, v in state_dict.items()}
    save_file(tensors, str(dst), metadata={'format': 'pt', 'source': Path(src).name})
    logger.info('wrote %d tensors to %s', len(tensors), dst)
    return len(tensors)


def _shares_storage(tensor: torch.Tensor) -> bool:
    return tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point ``lingbot_map_convert``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog='lingbot_map_convert',
        description='Convert a LingBot-Map checkpoint to .safetensors, checking every key '
                    'and shape against the model.')
    parser.add_argument('input', help='checkpoint to read (.pt, .pth, .bin, .ckpt, .safetensors)')
    parser.add_argument('output', help='.safetensors file to write')
    parser.add_argument('--no-check', action='store_true',
                        help='skip the name/shape check against the model')
    parser.add_argument('--preset', choices=['official', 'tiny'], default='official',
                        help='model the check uses (default: official)')
    parser.add_argument('--allow-pickle', action='store_true',
                        help='load with torch.load(weights_only=False): trusted files only')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    try:
        count = convert(args.input, args.output, check=not args.no_check, preset=args.preset,
                        allow_pickle=args.allow_pickle)
    except (WeightsError, ValueError, FileNotFoundError) as exc:
        logger.error('%s', exc)
        return 1
    logger.info('done: %d tensors', count)
    return 0


if __name__ == '__main__':
    sys.exit(main())
