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
"""A global place descriptor per frame, pooled from the frame's own DINO patch tokens.

Dims: S frames, N = h*w patch tokens, C embed dim (1024 for the official model: 4 KiB a
descriptor in float32).

Loop closure (docs/loop_closure.md) retrieves earlier keyframes of the same place by the
cosine similarity of one vector per keyframe. The network already computes what such a vector
needs: the final-normed DINOv2 patch tokens of every frame (``AggregatorOutput.dino_tokens``,
returned by every fast path: eager, segments, whole frames, batches). Pooling them costs a
few element-wise kernels on the device and no new weights.

Pooling (:func:`place_descriptor`), and why:

1. Each token is L2-normalised first. DINOv2's patch tokens differ in norm by an order of
   magnitude (a few high-norm tokens on flat, uninformative regions); normalised, every patch
   votes with its direction only, so a bright sky or a blank wall cannot outweigh the
   structure of the rest of the image.
2. The unit tokens are averaged: a bag of the patches' directions, invariant to where in the
   image they are (a revisit seldom has the same framing) and to the patch count (any size).
3. Signed square root (power normalisation, as for Fisher vectors and VLAD): damps channels
   that many similar patches drive together (burstiness: a repeated texture), so a few
   distinctive patches still count.
4. L2 normalisation: the dot product of two descriptors is their cosine similarity in
   [-1, 1], what the place index searches.

Nothing here is learned for retrieval; AnyLoc (Keetha et al. 2023) showed that pooled DINOv2
patch features already retrieve places well. With random weights (tests, demo) the
descriptor still says which images look alike, but not which places are the same.
"""

from __future__ import annotations

import torch

_EPS = 1e-12
"""Guards the normalisations against an all-zero vector (a zero descriptor stays zero)."""


def place_descriptor(dino_tokens: torch.Tensor) -> torch.Tensor:
    """Pool patch tokens ``[S, N, C]`` into ``[S, C]`` float32 L2-normalised descriptors.

    Runs on the tokens' device, in float32 whatever the tokens' dtype (bf16 on the GPU path).

    Args:
        dino_tokens: [S, N, C] final-normed DINO patch tokens of S frames.

    Returns:
        [S, C] float32 descriptors of unit norm (module docstring: the four steps).

    Raises:
        ValueError: not a [S, N, C] floating tensor with N >= 1.
    """
    if dino_tokens.ndim != 3 or not dino_tokens.is_floating_point() or dino_tokens.shape[1] < 1:
        raise ValueError(f'place_descriptor: want [S, N, C] float tokens, got '
                         f'{dino_tokens.dtype} {list(dino_tokens.shape)}')
    tokens = dino_tokens.float()
    unit = tokens / tokens.norm(dim=-1, keepdim=True).clamp_min(_EPS)
    pooled = unit.mean(dim=1)
    pooled = pooled.sign() * pooled.abs().sqrt()
    return pooled / pooled.norm(dim=-1, keepdim=True).clamp_min(_EPS)


def start_host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """Start copying ``tensor`` to the host without waiting for the device.

    On CUDA the copy goes into pinned memory with ``non_blocking``: it is queued on the
    current stream behind the work that computes ``tensor``, and is complete once any later
    blocking copy on that stream returns (the prediction's pose copy, made right after). On
    the CPU it is a plain copy.

    Args:
        tensor: a small device tensor (a descriptor).

    Returns:
        The host tensor (read it only after a later synchronising copy on the same stream).
    """
    if not tensor.is_cuda:
        return tensor.detach().to('cpu', copy=True)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor.detach(), non_blocking=True)
    return host
