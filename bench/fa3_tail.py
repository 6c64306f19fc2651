"""One layer's cache attention through ``Fa3RunAttention`` with and without the query tail.

At the model's shape (978 queries = 5 x 192 + 18, 16 heads of 64, 71,184 FP8 keys) FA3's
forward pads the last 18 rows to a 192-row tile per head and key part, a sixth of its work.
With ``joint_tail_rows`` those rows of a call of several runs go to our Triton kernel instead
(``cache.kernel.fa3_joint_tail_rows``). Timed here, each call as a CUDA graph (as in the
model), for one run (a camera) and two runs in one call (a batch of two: ``attend_runs``) at
several part counts and tail key parts; each variant's output is compared with the plain one
(no tail) and with float32 attention over the run for two heads.

Run on the GPU machine: ``PYTHONPATH=/tmp/site:$PWD python3 bench/fa3_tail.py`` (fa3-fwd and
triton installed). Prints a table, then one JSON line.
"""

import json
import statistics

from lingbot_map_ros.engine.attention.fa3 import Fa3RunAttention
import torch

HEADS, DIM, QUERIES, KEYS = 16, 64, 978, 71184


def graph_ms(fn, iters=40, repeats=5):
    """Median ms of one replay of ``fn`` captured as a CUDA graph."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times), out


def reference(q, k, v, heads=(0, 7)):
    """float32 attention of ``q: [Q, H, D]`` over ``k, v: [N, H, D]`` for a few heads."""
    outs = []
    for h in heads:
        s = (q[:, h].float() @ k[:, h].float().T) * DIM ** -0.5
        outs.append(torch.softmax(s, dim=-1) @ v[:, h].float())
    return torch.stack(outs, dim=1)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    gen = torch.Generator(device='cuda').manual_seed(0)
    # Two runs in one FP8 pool, apart (as two cameras' leases): [1000, 72184), [80000, ...).
    pool = 2 * KEYS + 20000
    k, v = (torch.randn(pool, HEADS, DIM, device='cuda', generator=gen).to(torch.float8_e4m3fn)
            for _ in range(2))
    q = torch.randn(2, QUERIES, HEADS, DIM, device='cuda', generator=gen).to(torch.bfloat16)
    bounds = torch.tensor([[1000, 1000 + KEYS], [80000, 80000 + KEYS]], dtype=torch.int32,
                          device='cuda')
    refs = [reference(q[b], k[lo:hi], v[lo:hi]) for b, (lo, hi) in enumerate(bounds.tolist())]
    rows, plain = [], {}
    variants = [(1, 4, 0, 16), (1, 8, 0, 16), (2, 4, 0, 16), (2, 4, 64, 8), (2, 4, 64, 16),
                (2, 4, 64, 32), (2, 8, 64, 16), (2, 2, 64, 16)]
    for runs, parts, tail, splits in variants:
        kernel = Fa3RunAttention(parts=parts, joint_parts=parts, joint_tail_rows=tail,
                                 tail_splits=splits)
        if runs == 1:
            ms, out = graph_ms(lambda kernel=kernel: kernel(q[0], k, v, bounds[0]))
            outs = [out]
        else:
            ms, out = graph_ms(lambda kernel=kernel: kernel.attend_runs(q, k, v, bounds))
            outs = list(out)
        if tail == 0 and parts == 4:
            plain[runs] = outs
        row = {'runs': runs, 'parts': parts, 'tail_rows': tail, 'tail_splits': splits,
               'ms': round(ms, 4), 'ms_per_run': round(ms / runs, 4),
               'err_vs_fp32': max(rel(o[:, (0, 7)], r) for o, r in zip(outs, refs)),
               'err_vs_plain': max(rel(o, p) for o, p in zip(outs, plain[runs]))}
        rows.append(row)
        print(f'runs {runs}  parts {parts}  tail_rows {tail:3d}  tail splits {splits:2d}  '
              f'{ms:8.4f} ms  ({ms / runs:.4f} a run)  err vs fp32 {row["err_vs_fp32"]:.4f}  '
              f'vs plain {row["err_vs_plain"]:.4f}', flush=True)
    print(json.dumps({'fa3_tail': rows}))


if __name__ == '__main__':
    main()
