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
"""Checkpoint loading: official ``.pt`` / converted ``.safetensors`` -> model, strictly checked.

Special:
- The key map is the identity: module names here are the official ``GCTStream`` state-dict names
  (1342 tensors for the official model; ``shared/docs/state_dict_keys.json``).
- ``.pt`` / ``.pth`` files are read with ``torch.load(weights_only=True)`` (no pickle code
  execution) unless the caller explicitly allows pickle. A ``{"model": state_dict}`` wrapper is
  unwrapped.
- ``point_head.*`` keys (present in some training checkpoints, never used here) are dropped with a
  warning. Everything else must match exactly: missing, unexpected and mis-shaped keys raise
  :class:`WeightsError` with counts and the first few names.
"""

from __future__ import annotations

from collections.abc import Mapping
import logging
from pathlib import Path

from safetensors.torch import load_file
import torch
from torch import nn

from ..errors import WeightsError

logger = logging.getLogger(__name__)

IGNORED_PREFIXES = ('point_head.',)
_PICKLE_SUFFIXES = ('.pt', '.pth', '.bin', '.ckpt')
_NAMES_SHOWN = 5


def load_checkpoint(path: str | Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Read a checkpoint file into a flat ``name -> tensor`` dict on the CPU.

    Args:
        path: ``.safetensors``, or a torch file (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) holding a
            state dict or ``{"model": state_dict}``.
        allow_pickle: load torch files with ``weights_only=False``. Only for trusted files that
            hold non-tensor objects; prefer converting them once with ``lingbot_map_convert``.

    Returns:
        The state dict (not yet checked against any model).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        WeightsError: not a regular file, unknown suffix, unreadable file, or content that is
            not a state dict.
    """
    path = Path(path)
    _check_regular_file(path)
    suffix = path.suffix.lower()
    if suffix == '.safetensors':
        try:
            return load_file(str(path), device='cpu')
        except Exception as exc:  # safetensors raises its own error types
            raise WeightsError(f'{path}: cannot read safetensors file: {exc}') from exc
    if suffix not in _PICKLE_SUFFIXES:
        raise WeightsError(f'{path}: unknown checkpoint suffix {suffix!r}; expected '
                           f'.safetensors or one of {_PICKLE_SUFFIXES}')
    with open(path, 'rb') as f:
        head = f.read(4)
    # torch.save writes a zip archive (PK) or, before torch 1.6, a pickle stream (0x80).
    if not (head.startswith(b'PK') or head.startswith(b'\x80')):
        raise WeightsError(f'{path}: not a torch checkpoint (neither a zip archive nor a '
                           f'pickle; starts with {head.hex() or "nothing"})')
    try:
        obj = torch.load(str(path), map_location='cpu', weights_only=not allow_pickle)
    except Exception as exc:  # torch.load raises UnpicklingError, RuntimeError, ...
        hint = ('' if allow_pickle else ' (loaded with weights_only=True; convert a trusted '
                'file with lingbot_map_convert --allow-pickle)')
        # torch's weights-only text runs to a dozen lines; its first line says what failed.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise WeightsError(f'{path}: cannot load torch checkpoint: {first}{hint}') from exc
    return _unwrap(obj, path)


def _check_regular_file(path: Path) -> None:
    """Raise a precise error unless ``path`` is a regular file."""
    if not path.exists():
        raise FileNotFoundError(f'checkpoint {path} does not exist')
    if path.is_dir():
        raise WeightsError(f'checkpoint {path} is a directory; give the checkpoint file in it')
    if not path.is_file():
        raise WeightsError(f'checkpoint {path} is not a regular file (a device or pipe)')


def _unwrap(obj: object, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping) and isinstance(obj.get('model'), Mapping):
        obj = obj['model']
    if not isinstance(obj, Mapping):
        raise WeightsError(f'{path}: expected a state dict, got {type(obj).__name__}')
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not torch.is_tensor(v)]
    if bad:
        raise WeightsError(f'{path}: {len(bad)} entries are not name -> tensor, e.g. '
                           f'{bad[:_NAMES_SHOWN]}')
    return dict(obj)


def drop_ignored(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove ``point_head.*`` (and other ignored prefixes) with a warning.

    Args:
        state_dict: checkpoint tensors.

    Returns:
        A new dict without the ignored keys.
    """
    kept = {k: v for k, v in state_dict.items() if not k.startswith(IGNORED_PREFIXES)}
    if len(kept) != len(state_dict):
        logger.warning('ignoring %d checkpoint tensors under %s (no such head is built)',
                       len(state_dict) - len(kept), ', '.join(IGNORED_PREFIXES))
    return kept


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Check names and shapes of ``state_dict`` against ``model`` (after :func:`drop_ignored`).

    Works for a model on the 'meta' device (nothing is read or copied).

    Args:
        model: the module the weights are meant for.
        state_dict: checkpoint tensors.

    Raises:
        WeightsError: missing, unexpected or mis-shaped keys (counts and first names of each).
    """
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    misshaped = [f'{k} {list(state_dict[k].shape)} != {list(shape)}'
                 for k, shape in expected.items()
                 if k in state_dict and tuple(state_dict[k].shape) != shape]
    problems = [f'{len(names)} {what} (e.g. {names[:_NAMES_SHOWN]})'
                for what, names in (('missing', missing), ('unexpected', unexpected),
                                    ('mis-shaped', misshaped)) if names]
    if problems:
        raise WeightsError(f'checkpoint does not match the model ({len(expected)} tensors): '
                           + '; '.join(problems))


def check_not_all_zero(state_dict: Mapping[str, torch.Tensor]) -> None:
    """Refuse a checkpoint whose every floating-point value is zero (a blank or wiped file).

    The scan stops at the first tensor holding a non-zero value: a real checkpoint's first one.

    Raises:
        WeightsError: every floating-point tensor is all zeros.
    """
    floats = [t for t in state_dict.values() if t.is_floating_point()]
    if floats and not any(bool(t.any()) for t in floats):
        raise WeightsError(f'every value of the checkpoint is zero ({len(floats)} tensors): '
                           'a blank or wiped file; give the LingBot-Map checkpoint')


def load_weights(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy checkpoint tensors into ``model`` after a strict name and shape check.

    Values are converted to each parameter's dtype and device (e.g. a bf16 aggregator).

    Args:
        model: the module to fill (e.g. ``LingbotMapModel``).
        state_dict: checkpoint tensors, e.g. from :func:`load_checkpoint`.

    Raises:
        WeightsError: missing, unexpected or mis-shaped keys, or every value zero.
    """
    state_dict = drop_ignored(state_dict)
    check_state_dict(model, state_dict)
    check_not_all_zero(state_dict)
    model.load_state_dict(state_dict, strict=True)
    logger.info('loaded %d tensors', len(state_dict))
