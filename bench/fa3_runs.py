"""FlashAttention-3 rows of ``attention_kernels.py`` (the ``fa3-fwd`` wheel, carried in ``.whl``).

Plain entry (``flash_attn_func``: the whole key tensor, its length a host shape) in bf16 and FP8
at fixed and automatic KV splits; the ``fa3`` backend's kernel object (``Fa3RunAttention``:
the varlen entry over device bounds, what a CUDA graph of a frame can hold) over an FP8 pool at
each split count and both query scalings; the same with a pool longer than the run (FA3's
heuristic sees the pool's length); two runs in one varlen launch against two launches (several
cameras: one grid instead of two); and a check that moved bounds inside a CUDA graph give what
a plain call on the slice gives.
"""

import torch
from kernel_table import bench_ms, errors, format_row, HEADS, optional_import, record, \
    reference, ROWS
from triton_runs import run_fn, split_scratch

VERSION = 'fa3-fwd 0.0.3'


def first(result):
    out = result[0] if isinstance(result, tuple) else result
    return out[0]  # [1, Q, H, D] -> [Q, H, D]


def plain_rows(fa3, checks, timed, flops):
    """The plain entry: bf16 at one and automatic splits, FP8 at several split counts."""
    def bf16(t, splits):
        q, k, v = (x.unsqueeze(0) for x in t)
        return lambda: first(fa3.flash_attn_func(q, k, v, num_splits=splits))
    for splits, label in ((1, 'one KV split'), (0, 'automatic KV splits')):
        record(f'FA3 bf16, {label}', lambda t, splits=splits: bf16(t, splits),
               checks, timed, flops, VERSION)

    def fp8(t, splits):
        scales = [x.abs().amax().float().clamp(min=1e-12) / 448.0 for x in t]
        q8, k8, v8 = ((x / s).to(torch.float8_e4m3fn).unsqueeze(0)
                      for x, s in zip(t, scales))
        q_d, k_d, v_d = (s.reshape(1, 1).expand(1, HEADS).contiguous() for s in scales)
        return lambda: first(fa3.flash_attn_func(
            q8, k8, v8, q_descale=q_d, k_descale=k_d, v_descale=v_d,
            num_splits=splits)).to(t[0].dtype)
    for splits in (0, 1, 2, 3, 4):
        label = 'auto splits' if splits == 0 else f'{splits} KV splits'
        record(f'FA3 FP8 e4m3 (per-tensor scales), {label}',
               lambda t, s=splits: fp8(t, s), checks, timed, flops, VERSION, bound=8e-2)


def run_rows(checks, timed, flops):
    """``Fa3RunAttention`` (varlen over device bounds) over bf16 and FP8 pools."""
    from lingbot_map_ros.engine.attention.fa3 import Fa3RunAttention

    def kernel(kv_fp8, fa3):
        return run_fn(lambda q, k, v, bounds, **_: fa3(q, k, v, bounds), {'splits': 1}, kv_fp8)
    record('FA3 run kernel (bf16), 1 part, auto splits',
           kernel(False, Fa3RunAttention(0, 'head', 1)), checks, timed, flops,
           'varlen over device bounds')
    record('FA3 run kernel (bf16), unit q, 4 parts',
           kernel(False, Fa3RunAttention(1, 'unit', 4)), checks, timed, flops,
           'the run as 4 sequences, merged')
    # Through the varlen entry every FA3 split count above one ran at ~0.72 ms (round 9):
    # the run cut into parts (sequences of one call) instead, and the split counts again.
    configs = [(scale, splits, 1) for scale in ('head', 'unit') for splits in (0, 1, 4)]
    configs += [('unit', 1, parts) for parts in (2, 3, 4, 5, 6, 8)]
    for scale, splits, parts in configs:
        label = (f'{parts} parts' if parts > 1 else
                 'auto splits' if splits == 0 else f'{splits} splits')
        record(f'FA3 run kernel (FP8 pool), {scale} q, {label}',
               kernel(True, Fa3RunAttention(splits, scale, parts)), checks[:1], timed, flops,
               'varlen over device bounds', bound=8e-2)

    def long_pool(t):
        # The backend passes the pool's length as max_seqlen_k: a pool 1.4x the run.
        q, k, v = t
        n = k.shape[0]
        pad = torch.zeros(n * 2 // 5, *k.shape[1:], dtype=torch.float8_e4m3fn,
                          device=k.device)
        k8 = torch.cat([k.to(torch.float8_e4m3fn), pad])
        v8 = torch.cat([v.to(torch.float8_e4m3fn), pad])
        bounds = torch.tensor([0, n], dtype=torch.int32, device=q.device)
        fa3 = Fa3RunAttention(0, 'head', 1)
        return lambda: fa3(q, k8, v8, bounds)
    record('FA3 run kernel (FP8 pool 1.4x the run), auto splits', long_pool, checks[:1],
           timed, flops, 'the heuristic sees the pool', bound=8e-2)


def two_run_rows(checks, flops):
    """Two key runs: one varlen launch over both, two launches, and our Triton kernel on two
    side streams at once (what ``runner/lanes.py`` does for two cameras)."""
    (q, k, v), ref = checks[0]
    if not q.is_cuda:
        return
    fa3 = optional_import('fa3_fwd_interface', 'FA3 (fa3-fwd)')
    n, n_q = k.shape[0], q.shape[0]
    k8, v8 = (torch.cat([x, x.flip(0)]).to(torch.float8_e4m3fn) for x in (k, v))
    q2 = torch.cat([q, q]).to(torch.float8_e4m3fn)
    ones = torch.ones(2, HEADS, dtype=torch.float32, device=q.device)
    cu_q = torch.tensor([0, n_q, 2 * n_q], dtype=torch.int32, device=q.device)
    cu_k = torch.tensor([0, n, 2 * n], dtype=torch.int32, device=q.device)
    ref2 = reference(q, k.flip(0), v.flip(0))
    rows = []
    if fa3 is not None:
        for splits in (0, 1, 2, 3):
            rows.append((f'FA3 FP8, two runs in one launch, {splits or "auto"} splits',
                         lambda s=splits: fa3.flash_attn_varlen_func(
                             q2, k8, v8, cu_q, cu_k, n_q, n, q_descale=ones, k_descale=ones,
                             v_descale=ones, num_splits=s)))
    from lingbot_map_ros.engine.attention.triton_attention import attend_run
    from lingbot_map_ros.engine.attention.triton_backend import triton_kernel_args
    from lingbot_map_ros.kernel_config import KernelConfig
    # The tiles of cache.kernel's defaults (the rows set the QK products themselves).
    cfg = {k: v for k, v in triton_kernel_args(KernelConfig()).items() if k != 'qk_split'}
    outs = [torch.empty_like(q), torch.empty_like(q)]
    scratch = [split_scratch(cfg, q), split_scratch(cfg, q)]
    bounds = [torch.tensor([0, n], dtype=torch.int32, device=q.device),
              torch.tensor([n, 2 * n], dtype=torch.int32, device=q.device)]
    sides = [torch.cuda.Stream(), torch.cuda.Stream()]

    def triton_pair(overlap):
        main = torch.cuda.current_stream()
        for i in range(2):
            stream = sides[i] if overlap else main
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                attend_run(q, k8, v8, bounds[i], out=outs[i], scratch=scratch[i], **cfg)
        if overlap:
            for s in sides:
                main.wait_stream(s)
        return torch.cat(outs)
    rows.append(('Triton FP8 KV, two runs, one stream', lambda: triton_pair(False)))
    rows.append(('Triton FP8 KV, two runs, two side streams', lambda: triton_pair(True)))
    for name, fn in rows:
        row = {'name': name, 'note': 'flops of both runs', 'bound': 8e-2}
        try:
            out = fn()
            out = out[0] if isinstance(out, tuple) else out
            torch.cuda.synchronize()
            err = [errors(out[:n_q].to(q.dtype), ref), errors(out[n_q:].to(q.dtype), ref2)]
            row.update(rel_err=max(e[0] for e in err), max_err=max(e[1] for e in err),
                       nan=sum(e[2] for e in err))
            ms = bench_ms(fn)
            row.update(ms=ms, tflops=2 * flops / ms / 1e9)
        except Exception as exc:  # noqa: BLE001 - reported as a row
            row['error'] = f'{type(exc).__name__}: {str(exc)[:300]}'
        ROWS.append(row)
        print(format_row(row), flush=True)


def bounds_check(checks):
    """FA3 over bounds [s, e) of the pool == FA3 over the slice; also inside a CUDA graph."""
    from lingbot_map_ros.engine.attention.fa3 import Fa3RunAttention
    (q, k, v), _ = checks[0]
    n = k.shape[0]
    row = {'name': 'FA3 run kernel: bounds and graph replay', 'note': '1 and 4 parts',
           'bound': 1e-3}
    try:
        worst = 0.0
        for kv_fp8, fa3 in ((False, Fa3RunAttention(0, 'head', 1)),
                            (True, Fa3RunAttention(1, 'unit', 4))):
            kk, vv = ((k, v) if not kv_fp8 else
                      (k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)))
            bounds = torch.tensor([0, n], dtype=torch.int32, device=q.device)
            graph = torch.cuda.CUDAGraph()
            fa3(q, kk, vv, bounds)  # warm
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                out = fa3(q, kk, vv, bounds)
            for lo, hi in ((977, n - 5000), (0, n // 3), (n // 2, n)):
                bounds.copy_(torch.tensor([lo, hi], dtype=torch.int32))
                graph.replay()
                sl = torch.tensor([0, hi - lo], dtype=torch.int32, device=q.device)
                want = fa3(q, kk[lo:hi].contiguous(), vv[lo:hi].contiguous(), sl)
                torch.cuda.synchronize()
                worst = max(worst, ((out.double() - want.double()).norm()
                                    / want.double().norm()).item())
        row.update(rel_err=worst, max_err=0.0, nan=0)
    except Exception as exc:  # noqa: BLE001 - reported as a row
        row['error'] = f'{type(exc).__name__}: {str(exc)[:300]}'
    ROWS.append(row)
    print(format_row(row), flush=True)


def fa3_candidates(checks, timed, flops, runs=True):
    """The plain-entry FA3 rows (``runs``: also the backend's kernel object and its bounds
    check; the two-run rows are ``two_run_rows``)."""
    fa3 = optional_import('fa3_fwd_interface', 'FA3 (fa3-fwd)')
    if fa3 is None:
        return
    plain_rows(fa3, checks, timed, flops)
    if runs:
        run_rows(checks, timed, flops)
        bounds_check(checks)
