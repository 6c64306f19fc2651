"""Which kernel runs the streaming cache attention fastest on this GPU (exploration, CUDA only).

One keyframe's queries (P = 6 + 972) over N_s + W = 72 frames of 972 patch tokens plus the
special stream of ``--frames`` keyframes, 16 heads x 64, bf16 (fp8 rows: e4m3 Q/K/V with unit
scales, bf16 output). Prints ms per call, TFLOP/s and the max error against an fp32 reference,
one line per kernel; unavailable kernels print why. Run from the repository root:
``python3 bench/attention_kernels.py``.
"""

import argparse
import math

import torch

from lingbot_map_ros.engine.attention.split import merge_partial, SplitAttention


def _time(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _heads_first(t):
    return t.unsqueeze(0).transpose(1, 2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--frames', type=int, default=500)
    parser.add_argument('--patches', type=int, default=972)
    args = parser.parse_args()
    torch.manual_seed(0)
    heads, dim, patches = 16, 64, args.patches
    queries = patches + 6
    patch_keys = 72 * patches
    keys = patch_keys + 6 * args.frames
    dev = torch.device('cuda')
    q = torch.randn(queries, heads, dim, device=dev, dtype=torch.bfloat16)
    k = torch.randn(keys, heads, dim, device=dev, dtype=torch.bfloat16)
    v = torch.randn(keys, heads, dim, device=dev, dtype=torch.bfloat16)
    ref = torch.nn.functional.scaled_dot_product_attention(
        _heads_first(q.float()), _heads_first(k.float()), _heads_first(v.float()))
    ref = ref[0].transpose(0, 1)
    flops = 4 * queries * keys * heads * dim
    print(f'Q={queries} K={keys} H={heads} D={dim}  {flops / 1e9:.1f} GFLOP per call')

    def report(name, fn):
        try:
            out = fn()
            ms = _time(fn)
        except Exception as exc:  # noqa: BLE001 - exploration: report and go on
            print(f'{name:34s} unavailable: {type(exc).__name__}: {str(exc)[:200]}')
            return
        err = (out.float() - ref).abs().max().item()
        print(f'{name:34s} {ms:7.3f} ms  {flops / ms / 1e9:6.0f} TFLOP/s  max err {err:.3g}',
              flush=True)

    def aten(op):
        return lambda: op(_heads_first(q), _heads_first(k), _heads_first(v))[0][0].transpose(0, 1)

    report('torch cudnn (one call)',
           aten(lambda a, b, c: torch.ops.aten._scaled_dot_product_cudnn_attention(
               a, b, c, None, False)))
    report('torch flash (one call)', aten(torch.ops.aten._scaled_dot_product_flash_attention))
    split = SplitAttention()
    report('split cudnn+flash (current sdpa)', lambda: split(q, k, v, patch_keys))
    try:
        import flashinfer
    except ImportError as exc:
        print('flashinfer missing:', exc)
        return
    for kernel in ('fa2', 'fa3'):
        report(f'flashinfer single {kernel}', lambda kernel=kernel:
               flashinfer.single_prefill_with_kv_cache(q, k, v, backend=kernel))
    # Split-KV by hand: the same queries as 2 / 4 requests over parts of the keys (more CTAs
    # than one 978-query request gives: 8 query tiles x 16 heads = 128 on 132 SMs), merged.
    for parts in (2, 4):
        def chunked(parts=parts):
            bounds = [round(keys * i / parts) for i in range(parts + 1)]
            outs = [flashinfer.single_prefill_with_kv_cache(
                q, k[a:b], v[a:b], backend='fa3', return_lse=True)
                for a, b in zip(bounds, bounds[1:])]
            o, lse = outs[0]
            lse = lse.transpose(0, 1) / math.log2(math.e)  # flashinfer lse is log2, [Q, H]
            for o2, lse2 in outs[1:]:
                o = merge_partial(o, lse, o2, lse2.transpose(0, 1) / math.log2(math.e))
            return o
        report(f'flashinfer fa3 x{parts} sequential+merge', chunked)
    workspace = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)
    for kernel in ('fa2', 'fa3'):
        for page in (patches, 1):
            try:
                wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, 'NHD',
                                                                         backend=kernel)
                pages = math.ceil(keys / page)
                kp = torch.zeros(pages * page, heads, dim, device=dev, dtype=torch.bfloat16)
                vp = torch.zeros_like(kp)
                kp[:keys], vp[:keys] = k, v
                kp, vp = kp.view(pages, page, heads, dim), vp.view(pages, page, heads, dim)
                last = keys - (pages - 1) * page
                wrapper.plan(torch.tensor([0, queries], dtype=torch.int32),
                             torch.tensor([0, pages], dtype=torch.int32),
                             torch.arange(pages, dtype=torch.int32, device=dev),
                             torch.tensor([last], dtype=torch.int32), heads, heads, dim, page,
                             causal=False, q_data_type=torch.bfloat16,
                             kv_data_type=torch.bfloat16)
            except Exception as exc:  # noqa: BLE001
                print(f'flashinfer paged {kernel} page {page}: plan failed: {exc}'[:240])
                continue
            report(f'flashinfer paged {kernel} page {page}',
                   lambda w=wrapper, kp=kp, vp=vp: w.run(q, (kp, vp)))
    f8 = torch.float8_e4m3fn
    q8, k8, v8 = q.to(f8), k.to(f8), v.to(f8)
    report('flashinfer single fa3 fp8', lambda: flashinfer.single_prefill_with_kv_cache(
        q8, k8, v8, backend='fa3', o_dtype=torch.bfloat16))


if __name__ == '__main__':
    main()
