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
"""Calls of our Triton kernels for ``attention_kernels.py``: one key run, a tile config each.

``cfg`` is the kernel's tile configuration (``block_m``, ``block_n``, ``num_warps``,
``num_stages``, ``splits``; the variants' ``fp8`` / ``exp_split``): the rows are named by it.
"""

import torch


def triton_fn(cfg, kv_fp8=False):
    from lingbot_map_ros.engine.attention.triton_attention import attend_run
    return run_fn(attend_run, cfg, kv_fp8)


def run_fn(attend, cfg, kv_fp8):
    """Return a builder of ``attend`` over the whole key run with ``cfg`` (K/V in e4m3)."""
    def build(t):
        q, k, v = t
        if kv_fp8:
            k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        bounds = torch.tensor([0, k.shape[0]], dtype=torch.int32, device=q.device)
        out = torch.full_like(q, float('nan'))
        scratch = split_scratch(cfg, q)
        return lambda: attend(q, k, v, bounds, out=out, scratch=scratch, **cfg)
    return build


def fast_fn(cfg, kv_fp8=False):
    """Our Triton kernel's variants (``triton_fp8.attend_run_fast``, beside this file)."""
    from triton_fp8 import attend_run_fast
    return run_fn(attend_run_fast, cfg, kv_fp8)


def split_scratch(cfg, q):
    """Return the key parts' outputs [splits, Q, H, D] and log2-sum-exps [splits, H, Q]."""
    return (torch.empty(cfg['splits'], *q.shape, dtype=torch.float32, device=q.device),
            torch.empty(cfg['splits'], q.shape[1], q.shape[0], dtype=torch.float32,
                        device=q.device))


def cfg_name(cfg):
    return (f"m{cfg['block_m']} n{cfg['block_n']} w{cfg['num_warps']} s{cfg['num_stages']} "
            f"x{cfg['splits']}" + (' qk8' if cfg.get('qk_fp8') else ''))


def fast_name(cfg):
    return (' fp8' if cfg.get('fp8') else '') + (' exp-split' if cfg.get('exp_split') else '')
