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
"""FA3's unit-scale query cast (CPU); its knobs are ``cache.kernel`` (test_kernel_config.py)."""

from lingbot_map_ros.engine.attention.fa3 import unit_scale_queries
import torch


def test_unit_scale_queries_round_to_e4m3_and_saturate_instead_of_overflowing():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(50, 4, 64, generator=gen) * 2.0
    q[0, 0, :3] = torch.tensor([1000.0, -1000.0, 448.0])
    q8 = unit_scale_queries(q)
    assert q8.dtype == torch.float8_e4m3fn
    back = q8.float()
    assert not torch.isnan(back).any()
    assert back[0, 0, :3].tolist() == [448.0, -448.0, 448.0]
    body = q[1:]
    # e4m3 keeps 3 mantissa bits: relative rounding <= 2^-4 for normal values.
    normal = body.abs() >= 2.0 ** -6
    rel = ((back[1:] - body).abs() / body.abs())[normal]
    assert rel.max().item() <= 2.0 ** -4 + 1e-6
    assert ((back[1:] - body).norm() / body.norm()).item() < 4e-2
