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
"""What the tools' console scripts answer instead of a traceback: one line and exit status 1.

:data:`USAGE_ERRORS` are the errors of a set-up this machine cannot run (no GPU, a missing
package or file, a bad value); :func:`check_device` refuses a CUDA device on a machine without
one before torch fails deep inside (``Torch not compiled with CUDA enabled``).
"""

from __future__ import annotations

from lingbot_map_ros.engine.errors import LingbotMapError
import torch

USAGE_ERRORS = (ValueError, ImportError, OSError, LingbotMapError)
"""Caught by the console scripts' ``main`` and printed as one line."""


def check_device(device: str, source: str, cpu_hint: str = '') -> None:
    """Refuse a CUDA ``device`` where torch sees no CUDA device.

    Args:
        device: a torch device string ('cpu', 'cuda', 'cuda:1').
        source: the flag or parameter that named it, for the message.
        cpu_hint: how to run on the CPU instead, appended to the message.

    Raises:
        ValueError: CUDA asked for but not available.
    """
    if torch.device(device).type == 'cuda' and not torch.cuda.is_available():
        build = 'a CPU-only build' if torch.version.cuda is None else 'no CUDA device visible'
        raise ValueError(f"{source}='{device}' but this machine has no CUDA (torch "
                         f'{torch.__version__}: {build})' + (f'; {cpu_hint}' if cpu_hint else ''))
