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
"""Split attention: two partial softmax attentions merged by log-sum-exp equal the full one.

The merge runs on any device; the cuDNN + flash kernels of the split need CUDA (marker gpu).
Run: ``python -m pytest test/engine/test_split_attention.py`` (under a second).
"""

from __future__ import annotations

import math

from lingbot_map_ros.engine.attention.split import merge_partial, SplitAttention
import pytest
import torch


def _partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Naive float64 attention over one key set, with its natural log-sum-exp [H, Q]."""
    scores = torch.einsum('qhd,khd->hqk', q, k) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum('hqk,khd->qhd', torch.softmax(scores, dim=-1), v)
    return out, lse


@pytest.mark.parametrize('split_at', [1, 37, 199])
def test_merge_of_two_key_sets_equals_attention_over_all_keys(split_at):
    gen = torch.Generator().manual_seed(split_at)
    q, k, v = (torch.randn(n, 4, 16, generator=gen, dtype=torch.float64) * 2
               for n in (23, 200, 200))
    full, _ = _partial(q, k, v)
    o1, lse1 = _partial(q, k[:split_at], v[:split_at])
    o2, lse2 = _partial(q, k[split_at:], v[split_at:])
    merged = merge_partial(o1, lse1, o2, lse2)
    torch.testing.assert_close(merged, full, atol=1e-6, rtol=0)
    # A merge that ignored the weights would be far off: the parts really differ.
    assert (o1 - full).abs().max() > 1e-2


def test_split_applies_only_to_cuda_half_precision_with_two_parts():
    split = SplitAttention()
    cpu_q = torch.zeros(3, 2, 8, dtype=torch.bfloat16)
    assert not split.usable(cpu_q, 10, 20)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cudnn_plus_flash_split_matches_float32_attention_on_cuda():
    gen = torch.Generator(device='cuda').manual_seed(0)
    q, k, v = (torch.randn(n, 16, 64, generator=gen, device='cuda').to(torch.bfloat16)
               for n in (978, 8 * 972 + 600, 8 * 972 + 600))
    split = SplitAttention()
    out = split(q, k, v, 8 * 972)
    assert out is not None and split.enabled
    ref, _ = _partial(q.double(), k.double(), v.double())
    assert (out.double() - ref).abs().max() < 2e-2
