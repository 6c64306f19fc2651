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
"""A batch's staged frames, one block's cache work for all of them: one write, one launch.

Dims: B streams (one staged frame each, slot b of the batch), P tokens per frame, H heads of D.

Why: in a whole batch (``runner/whole_batch.py``) each slot writes its frame's K/V and attends
over its own run, per global block. Issued slot by slot that is, per block, B writes of K and
of V and B attention launches (run side by side on the lanes); for backend ``fa3`` each
attention is itself three launches (``fa3_parts.py``). The slots' runs all lie in the one pool,
so the B frames' K/V are one ``index_copy`` each (the slots' destinations concatenated) and
the B runs one FA3 varlen call of ``B * parts`` sequences, each with its run's bounds (plus
each run's last query rows on our kernel, ``fa3.py``): one FA3 grid instead of one per stream,
which two cameras run faster than slot by slot (docs/performance.md, 'Batches of cameras').

Only forms whose run kernel has ``attend_runs`` take part (backend ``fa3`` with parts), and
only when every slot's key is one range; otherwise the batch runs slot by slot. The slots'
staged numbers are read inside the batch's graph (concatenated per replay), so one captured
batch serves every frame of its key, as the slots do alone. ``cache.kernel.staged_runs`` false
(the pool's ``kernel``) runs every batch slot by slot (the benchmarks' A/B of the two forms).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from lingbot_map_ros.engine.attention.staged import token_operands
from lingbot_map_ros.engine.cache.staged_frames import StagedFrames
import torch

if TYPE_CHECKING:
    from lingbot_map_ros.engine.attention.staged import StagedKey

RunsKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(q: [B, Q, H, D], k, v: [N, H, D], bounds: [B, >= 2]) -> [B, Q, H, D]``."""


def joint_kernel(slots: Sequence[StagedFrames], keys: Sequence[StagedKey]) -> RunsKernel | None:
    """Return the kernel that attends every slot's run at once, or None (slot by slot).

    None unless the pool's ``cache.kernel.staged_runs`` is on, there are two slots or more,
    every key is one range and the slots' form has a several-run kernel (they share the pool,
    so they share its kernel). Read when a batch is built: a captured batch keeps its form.
    """
    if len(slots) < 2 or not slots[0].pool.kernel.staged_runs \
            or any(key != ('range',) for key in keys):
        return None
    return slots[0].joint_kernel()


class StagedRuns:
    """The slots' writes and attentions of a block at once (build inside the batch's graph).

    Args:
        slots: the batch's slots, each with its frame staged.
        kernel: ``joint_kernel(slots, keys)``.
    """

    def __init__(self, slots: Sequence[StagedFrames], kernel: RunsKernel) -> None:
        self._storage = slots[0].pool.storage
        self._kernel = kernel
        # Device ops on the slots' staged numbers: captured, so every replay reads the
        # numbers staged for it.
        self._index = torch.cat([slot.index for slot in slots])
        self._bounds = torch.stack([slot.bounds for slot in slots])

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write every slot's ``k, v`` and attend its ``q`` over its run, for block ``layer``.

        Args:
            q, k, v: ``[B, P, H, D]``, contiguous (row b is slot b's frame).

        Returns:
            ``[B, P, H, D]`` in the queries' dtype.

        Raises:
            ValueError: the rows are not one frame per slot.
        """
        runs, tokens, heads, dim = k.shape
        if runs != self._bounds.shape[0] or runs * tokens != self._index.numel():
            raise ValueError(f'staged runs: K/V of {runs} frame(s) of {tokens} tokens for '
                             f'{self._bounds.shape[0]} slots of {self._index.numel()} tokens')
        storage = self._storage
        storage.write(layer, self._index, k.reshape(runs * tokens, heads, dim),
                      v.reshape(runs * tokens, heads, dim))
        return self._kernel(*token_operands(q, storage.k[layer], storage.v[layer]),
                            self._bounds)
