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
"""The table ``attention_kernels.py`` fills: inputs, the float64 reference, checked and timed rows.

Every candidate goes through :func:`record`: correctness on fresh check sets against float64
first, then the median time over the timed sets; a failure becomes a row that says why.
"""

import math
import time
import traceback

import torch

HEADS, DIM, PATCHES, SPECIALS = 16, 64, 972, 6
ROWS = []
DTYPE = [torch.bfloat16]  # fp16 in CPU dry runs: Triton's interpreter has no bf16 matmul


def heads_first(t):
    """[N, H, D] -> [1, H, N, D] view."""
    return t.unsqueeze(0).transpose(1, 2)


def make_inputs(n_q, n_k, dev, seed):
    """Fresh bf16 q [Q, H, D], k, v [K, H, D] (randn: post-LayerNorm-like, std 1)."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    return tuple(torch.randn(n, HEADS, DIM, device=dev, generator=gen).to(DTYPE[0])
                 for n in (n_q, n_k, n_k))


def reference(q, k, v):
    """float64 attention of the given (bf16) inputs, one head at a time; [Q, H, D] fp64."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for h in range(q.shape[1]):
        qh, kh, vh = (t[:, h].double() for t in (q, k, v))
        s = (qh @ kh.T) / math.sqrt(DIM)
        out[:, h] = torch.softmax(s, dim=-1) @ vh
        del s
    return out


def errors(out, ref):
    """(relative L2 error, max abs error, NaN count) of ``out`` against ``ref``."""
    o = out.double()
    nans = int(torch.isnan(o).sum().item())
    diff = torch.nan_to_num(o - ref, nan=float('inf'))
    return (diff.norm() / ref.norm()).item(), diff.abs().max().item(), nans


def record(name, fn_for, checks, timed, flops, note='', bound=2e-2):
    """Check ``fn_for(inputs)`` on every check set, time it over the timed sets, add a row.

    ``bound``: the relative error the row must stay under (bf16 operands: 2e-2; FP8 rows
    carry e4m3's 2^-4 rounding, so 8e-2).
    """
    row = {'name': name, 'note': note, 'bound': bound}
    try:
        worst = (0.0, 0.0, 0)
        for inputs, ref in checks:
            fn = fn_for(inputs)
            out = fn()
            if out.is_cuda:
                torch.cuda.synchronize()
            err = errors(out, ref)
            worst = tuple(max(a, b) for a, b in zip(worst, err))
        row.update(rel_err=worst[0], max_err=worst[1], nan=worst[2])
        fns = [fn_for(inputs) for inputs in timed]
        turn = [0]

        def step():
            turn[0] = (turn[0] + 1) % len(fns)
            fns[turn[0]]()
        ms = bench_ms(step)
        row.update(ms=ms, tflops=flops / ms / 1e9)
    except Exception as exc:  # noqa: BLE001 - one candidate failing must not stop the rest
        row['error'] = f'{type(exc).__name__}: {str(exc)[:300]}'
        row['trace'] = traceback.format_exc()[-2000:]
    ROWS.append(row)
    print(format_row(row), flush=True)
    return row


def bench_ms(step):
    """Median ms of ``step`` (CUDA: do_bench's events; CPU dry runs: a host clock)."""
    if torch.cuda.is_available():
        import triton.testing
        return triton.testing.do_bench(step, warmup=25, rep=150, return_mode='median')
    times = []
    for _ in range(3):
        began = time.perf_counter()
        step()
        times.append((time.perf_counter() - began) * 1e3)
    return sorted(times)[1]


def passed(row):
    return 'error' not in row and row['nan'] == 0 and row['rel_err'] < row.get('bound', 2e-2)


def format_row(row):
    if 'error' in row:
        return f"{row['name']:44s} unavailable: {row['error'][:160]}"
    ok = 'OK ' if passed(row) else 'BAD'
    return (f"{row['name']:44s} {row.get('ms', float('nan')):7.3f} ms "
            f"{row.get('tflops', float('nan')):6.0f} TFLOP/s  rel {row['rel_err']:.2e}  "
            f"max {row['max_err']:.2e}  {ok} {row['note']}")


def optional_import(module, name):
    """Import ``module``, or add a row saying why it is unavailable and return None."""
    import importlib
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means: not this candidate
        ROWS.append({'name': name, 'error': f'not importable: {exc}'})
        print(format_row(ROWS[-1]))
        return None
