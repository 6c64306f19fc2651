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
"""StepLog: one page table for all layers; the first layer decides a step, the others replay it.

Every layer (block) of the model runs the same sequence of cache calls for a frame: append ->
evict -> attend for a keyframe, append -> attend -> rollback for a non-keyframe, one append per
scale frame in phase 1. So all layers have the same page structure, and one page table can serve
them all. The model runs block 0's calls, then block 1's, and so on:

::

    step (head)      :   s        s+1        s+2
    block 0 (leader) : append -> evict   -> attend        the table decides each step
    block 1          :                      append -> evict -> attend    replays s, s+1
    ...

A block whose position is the log's head *leads*: its call runs the page table and the step is
recorded. A block behind the head *follows*: its call must be the next recorded step, whose
physical writes (frame page, special slots, page moves) it replays on its own tensors, and it
attends with the layout recorded at its own position. Host work per layer is a list lookup.

When every block is back at the head the log is cleared, so it holds at most one frame's steps
in normal use (``N_s`` appends during phase 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from lingbot_map_ros.engine.cache.page_table import PageLayout, StepKind, TableStep
from lingbot_map_ros.engine.errors import CacheStateError
import torch

MAX_LAG_STEPS = 4096
"""Most steps a block may trail the leading block before the log refuses to grow."""


@dataclass(frozen=True, slots=True)
class LoggedStep:
    """A table step plus what the leader computed for the followers."""

    step: TableStep
    """What the page table did."""
    keyframe: bool = True
    """append: whether the frame was appended as a keyframe."""
    index: torch.Tensor | None = None
    """append: destination pool token index of each of the frame's ``P`` tokens."""


class StepLog:
    """Positions of every block in the shared sequence of table steps.

    Args:
        num_blocks: Blocks (layers) that share the table.
        layout: Layout of the empty table.
    """

    def __init__(self, num_blocks: int, layout: PageLayout) -> None:
        self._num_blocks = num_blocks
        self.reset(layout)

    def reset(self, layout: PageLayout) -> None:
        """Put every block at step 0 with ``layout`` and drop the log."""
        self._positions = [0] * self._num_blocks
        self._head = 0
        self._num_at_head = self._num_blocks
        self._base = 0
        self._base_layout = layout
        self._steps: list[LoggedStep] = []

    def position(self, block_idx: int) -> int:
        """Return how many steps ``block_idx`` has done since the last reset."""
        return self._positions[block_idx]

    def leads(self, block_idx: int) -> bool:
        """Whether ``block_idx`` is at the head, so its next call makes a new step."""
        return self._positions[block_idx] == self._head

    def layout(self, block_idx: int) -> PageLayout:
        """Visible pages as ``block_idx`` sees them (after its own last step)."""
        done = self._positions[block_idx] - self._base
        return self._steps[done - 1].step.layout if done else self._base_layout

    def reserve(self, block_idx: int) -> None:
        """Make room for the step the leading ``block_idx`` is about to make.

        Called before the page table changes, so a refusal leaves table and log in step.

        Raises:
            CacheStateError: some block trails by ``MAX_LAG_STEPS`` steps.
        """
        if self._num_at_head == self._num_blocks:
            # Nobody needs the old steps any more.
            self._base_layout = self.layout(block_idx)
            self._base = self._head
            self._steps.clear()
        elif len(self._steps) >= MAX_LAG_STEPS:
            lagging = min(range(self._num_blocks), key=self._positions.__getitem__)
            raise CacheStateError(
                f'block {lagging} is at cache step {self._positions[lagging]} while block '
                f'{block_idx} is at step {self._head}: every block must make the same '
                'append/evict/rollback calls for each frame')

    def record(self, block_idx: int, logged: LoggedStep) -> None:
        """Append the step the leading ``block_idx`` just made (after ``reserve``)."""
        self._steps.append(logged)
        self._head += 1
        self._positions[block_idx] = self._head
        self._num_at_head = 1

    def follow(self, block_idx: int, kind: StepKind, keyframe: bool = True) -> LoggedStep:
        """Return the step ``block_idx`` replays now and move it past it.

        Args:
            block_idx: A block behind the head.
            kind: The call the block makes.
            keyframe: append: whether the block appends a keyframe.

        Returns:
            The recorded step.

        Raises:
            CacheStateError: the block's call is not the step the leader made next.
        """
        position = self._positions[block_idx]
        logged = self._steps[position - self._base]
        if logged.step.kind != kind or (kind == 'append' and logged.keyframe != keyframe):
            made = logged.step.kind + (f'(keyframe={logged.keyframe})' if kind == 'append'
                                       else '')
            raise CacheStateError(
                f'block {block_idx} calls {kind} at cache step {position}, but the leading '
                f'block made {made} there: every block must make the same '
                'append/evict/rollback calls in the same order')
        self._positions[block_idx] = position + 1
        if position + 1 == self._head:
            self._num_at_head += 1
        return logged
