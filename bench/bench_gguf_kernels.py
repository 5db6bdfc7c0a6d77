"""Benchmark the GGUF kernels on CUDA: Triton (as the runtime dispatches it) vs the torch reference
(dequantize + matmul) vs a dense bf16 matmul of the same shape. Reports ratios, not targets.

    python bench/bench_gguf_kernels.py                      # default types, shapes, token counts
    python bench/bench_gguf_kernels.py --sweep              # also time more launch configs
    python bench/bench_gguf_kernels.py --types Q4_K --shapes 4096x4096 --tokens 1,8,512

Shapes are ``rows x cols`` of the weight (``out x in``); ``y[T, rows] = x[T, cols] @ W.T``.
Times are per weight as a decode step sees them: each variant runs over enough distinct copies
of the weight (at least 256 MB of dense bf16, beyond any L2 cache) inside one CUDA graph, as the
engine replays decode steps, so neither host launch overhead nor a warm L2 flatters a kernel.
(Plain ``do_bench`` timing of one ~20 us launch measured the Python launch path, not the GPU.)
The median of 20 replays divided by the number of copies is reported; kernels are compiled
first in parallel processes.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import multiprocessing
import os
import re

import torch

# fp16 scale fields per type (ggml block structs): random blocks get small finite scales there.
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,),
               "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}
# (BM, BN, BK, num_warps, split-K or None for automatic). COMPARE runs by default, SWEEP with --sweep.
COMPARE = {"decode": [(1, 8, 256, 4, None), (1, 4, 1024, 4, 1)], "small": [(16, 32, 128, 4, None)],
           "batch": [(16, 64, 128, 4, None), (32, 64, 128, 4, None), (64, 64, 64, 4, 1)],
           "prefill": [(128, 64, 64, 4, 1)]}
SWEEP = {"decode": [(1, 16, 256, 4, 1), (1, 8, 1024, 8, 1), (1, 16, 512, 4, 1), (1, 8, 512, 4, 2),
                    (1, 16, 1024, 8, 1), (1, 8, 512, 8, None)],
         "small": [(16, 16, 256, 4, None), (16, 64, 64, 4, 1), (16, 32, 256, 8, 1), (16, 64, 128, 4, None)],
         "batch": [(32, 128, 64, 8, 1), (64, 128, 64, 8, 1), (32, 32, 128, 4, None), (32, 64, 256, 4, 1),
                   (64, 64, 128, 8, 1), (64, 64, 256, 8, 1), (64, 32, 256, 4, None)],
         "prefill": [(128, 128, 64, 8, 1)]}

# token-unrolled dp4a GEMV (BN rows per program, BK columns per step, num_warps, stages, K split or None for
# automatic), T <= 8
TOKENS_SWEEP = [(1, 1024, 1, 2, None), (2, 1024, 1, 2, None), (1, 4096, 1, 2, None), (2, 2048, 2, 2, None),
                (1, 2048, 2, 2, None), (4, 1024, 2, 2, None), (1, 2048, 1, 3, None), (2, 512, 1, 2, None),
                (1, 2048, 4, 2, None), (1, 1024, 4, 2, None), (1, 512, 4, 2, None), (1, 1024, 2, 2, None),
                (1, 512, 2, 2, None), (1, 1024, 1, 2, 2), (1, 512, 1, 2, 4)]
# int8 tensor-core kernel (BN rows per program, num_warps, split-K or None for automatic, stages); BM is
# the token count rounded up (16-64)
MMQ_COMPARE = [(64, 4, None, 2), (32, 4, None, 2)]
# (BN, warps, stages, programs per SM for the K split) of the 16-bit tensor-core kernel (triton_dot16)
DOT16_SWEEP = [(64, 4, 2, 4), (64, 4, 2, 2), (64, 4, 3, 8), (64, 4, 4, 4), (128, 8, 2, 4), (64, 4, 2, 1),
               (64, 4, 1, 4), (128, 8, 1, 4), (64, 8, 2, 4)]
DOT16_GROUPS = (1, 2, 4, 8)   # Q4_0/Q8_0 blocks per K-loop iteration (the default launch otherwise)
# (programs per SM for the K split, stages of activations) of the Gluon kernels (gluon_ops), 8-64 tokens
GLUON_SWEEP = [(4, 2), (8, 2), (2, 2), (4, 3)]
MMQ_SWEEP = [(128, 8, None, 2), (64, 4, 2, 3), (64, 4, 4, 3), (32, 2, 2, 3), (32, 4, 4, 3), (16, 1, 4, 3),
             (16, 2, 2, 4), (32, 2, 8, 3), (64, 8, 4, 3), (128, 4, 2, 3)]


def _gluon_runs() -> bool:
    """Whether this GPU runs the Gluon kernels (compute capability 9.0 and a Triton with Gluon)."""
    from toolkit.kernels.gguf import gluon_ops
    return gluon_ops._runs_on(torch.device("cuda"))


def random_packed(name: str, rows: int, cols: int) -> torch.Tensor:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    size, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    blocks = torch.randint(0, 256, (rows * cols // size, nbytes), dtype=torch.uint8, device="cuda")
    for offset in FP16_FIELDS[name]:
        scale = (torch.rand(blocks.shape[0], 1, device="cuda") * 0.02 - 0.01).half()
        blocks[:, offset:offset + 2] = scale.view(torch.uint8)
    return blocks.view(rows, -1)


# --variants: a regex on the labels (the baselines "triton", "reference", "dense_bf16" always run)
VARIANT_FILTER = os.environ.get("BENCH_GGUF_VARIANTS", "")
BASELINES = ("triton", "reference", "dense_bf16")


def variants(name: str, rows: int, cols: int, tokens: int, sweep: bool, copies: int = 1) -> dict:
    """label -> zero-argument callable that computes the same ``[tokens, rows]`` product once per copy
    of the weight (``copies`` distinct random weights of the same type and shape)."""
    out = _all_variants(name, rows, cols, tokens, sweep, copies)
    if VARIANT_FILTER:
        out = {label: fn for label, fn in out.items() if label in BASELINES or re.search(VARIANT_FILTER, label)}
    return out


def _all_variants(name: str, rows: int, cols: int, tokens: int, sweep: bool, copies: int = 1) -> dict:
    from gguf import GGMLQuantizationType
    from toolkit.kernels.gguf import dot16_ops, gemv_launch, gluon_ops, gluon_tokens_ops, reference, triton_ops
    qtype = int(GGMLQuantizationType[name])
    weights = []
    for _ in range(copies):
        data = random_packed(name, rows, cols)
        weights.append((data, triton_ops.gguf_dequantize(data, qtype, cols, torch.bfloat16)))
    x = torch.randn(tokens, cols, device="cuda", dtype=torch.bfloat16)

    def each(op):
        return lambda: [op(data, dense) for data, dense in weights]

    out = {"triton": each(lambda data, dense: triton_ops.gguf_matmul(x, data, qtype, cols)),
           "reference": each(lambda data, dense: reference.gguf_matmul(x, data, qtype, cols)),
           "dense_bf16": each(lambda data, dense: x @ dense.T)}
    regime = "decode" if tokens == 1 else "small" if tokens <= 16 else "batch" if tokens <= 64 else "prefill"
    for bm, bn, bk, warps, split in COMPARE[regime] + (SWEEP[regime] if sweep else []):
        config = triton_ops.MatmulConfig(bm=bm, bn=bn, bk=bk, num_warps=warps)
        out[f"fused{bm}x{bn}x{bk}w{warps}s{split or 'auto'}"] = each(
            lambda data, dense, c=config, s=split: triton_ops.fused_matmul(x, data, qtype, cols, c, split=s))
    if tokens <= 8 and name in triton_ops.DP4A_STEP:  # the token-unrolled dp4a GEMV's launch shapes
        float_config = (triton_ops.DECODE_CONFIG_BY_TYPE.get(name, triton_ops.DECODE_CONFIG) if tokens == 1
                        else triton_ops.SMALL_BATCH_CONFIG)                      # the float kernel it replaced
        out["float_kernel"] = each(lambda data, dense: triton_ops.fused_matmul(x, data, qtype, cols, float_config))
        out["tokens_default"] = each(lambda data, dense: triton_ops.dp4a_tokens_matmul(x, data, qtype, cols))
        # as a decode step runs it: x's int8 blocks attached by the op that wrote x (a norm, an activation), split-K
        # partial sums handed to the next op; "tokens_default" also rounds x and reduces the sums (two more launches)
        sums = name in gemv_launch.TOKENS_SUM_TYPES
        handed = handed_on(x, sums)
        out["tokens_handed_on"] = each(lambda data, dense: triton_ops.dp4a_tokens_matmul(handed, data, qtype, cols,
                                                                                        unreduced=True))
        for bn, bk, warps, stages, split in (TOKENS_SWEEP if sweep else []):
            config = triton_ops.GemvConfig(bn=bn, bk=bk, num_warps=warps, num_stages=stages, split=split)
            out[f"tokens{bn}x{bk}w{warps}s{stages}k{split or 'auto'}"] = each(
                lambda data, dense, c=config: triton_ops.dp4a_tokens_matmul(x, data, qtype, cols, c))
    if 2 <= tokens <= 8 and name in gluon_tokens_ops.TYPES and _gluon_runs():  # int8 mma.sync GEMV (H100/H200)
        # both with the activations rounded to int8 blocks inside, as "tokens_default" (the dispatch's) has them
        out["gluon_tokens"] = each(lambda data, dense: gluon_tokens_ops.gluon_tokens(
            *triton_ops.quantize_activations(x), data, cols, x, gluon_tokens_ops.LAUNCH))
        config = gemv_launch.tokens_config(name, tokens, rows, cols)    # a launch given: the dp4a GEMV itself
        out["dp4a_tokens"] = each(lambda data, dense, c=config: triton_ops.dp4a_tokens_matmul(x, data, qtype, cols, c))
    if regime in ("small", "batch") and name in triton_ops.MMQ_TYPES:  # the int8 tensor-core kernel's tile shapes
        out["mmq_default"] = each(lambda data, dense: triton_ops.mmq_matmul(x, data, qtype, cols))  # mmq_config's
        for bn, warps, split, stages in MMQ_COMPARE + (MMQ_SWEEP if sweep else []):
            out[f"mmq_n{bn}w{warps}s{split or 'auto'}p{stages}"] = each(
                lambda data, dense, bn=bn, warps=warps, split=split, stages=stages: triton_ops.mmq_matmul(
                    x, data, qtype, cols, bn=bn, num_warps=warps, split=split, num_stages=stages))
    if regime in ("small", "batch") and name in dot16_ops.DOT16_TYPES:  # weights decoded to 16 bits, bf16 MMA
        out["dot16_default"] = each(lambda data, dense: dot16_ops.dot16_matmul(x, data, qtype, cols))
        for bn, warps, stages, per_sm in DOT16_SWEEP:
            out[f"dot16_n{bn}w{warps}p{stages}m{per_sm}"] = each(
                lambda data, dense, bn=bn, warps=warps, stages=stages, per_sm=per_sm: dot16_ops.dot16_matmul(
                    x, data, qtype, cols, bn=bn, num_warps=warps, num_stages=stages, programs_per_sm=per_sm))
        for group in DOT16_GROUPS if name in ("Q4_0", "Q8_0") else ():
            out[f"dot16_g{group}"] = each(
                lambda data, dense, group=group: dot16_ops.dot16_matmul(x, data, qtype, cols, group=group))
    if regime in ("small", "batch") and 8 <= tokens <= 64 and name in ("Q4_K", "Q6_K", "Q4_0") and _gluon_runs():
        # the Gluon kernels (H100/H200): "dot16_default" above is one of them where GLUON_RULES take the shape
        bm = dot16_ops.token_tile(tokens)  # the dispatch's
        for per_sm, stages in GLUON_SWEEP:
            out[f"gluon_m{per_sm}p{stages}"] = each(
                lambda data, dense, per_sm=per_sm, stages=stages: gluon_ops.gluon_matmul(
                    x, data, name, cols, bm, programs_per_sm=per_sm, stages=stages))
    if regime != "decode":
        out["triton_dequant+mm"] = each(lambda data, dense: x @ triton_ops.gguf_dequantize(data, qtype, cols,
                                                                                           x.dtype).T)
    if regime in ("decode", "small"):  # the element-wise tiles, to show what the word-wise ones buy
        config = triton_ops.DECODE_CONFIG if tokens == 1 else triton_ops.SMALL_BATCH_CONFIG
        out["elementwise"] = each(lambda data, dense: triton_ops.fused_matmul(x, data, qtype, cols, config,
                                                                             words=False))
    return out


def handed_on(x: torch.Tensor, sums: bool) -> torch.Tensor:
    """A copy of ``x`` carrying its int8 blocks (``int8_blocks.attach``), as the norm or activation that wrote it hands
    them to the GEMV in a decode step; ``sums``: with Q4_K/Q5_K's block sums."""
    from toolkit.kernels import int8_blocks
    from toolkit.kernels.gguf import dp4a_ops
    words, scales, *block_sums = dp4a_ops.quantize_activations(x, sums=sums)
    return int8_blocks.attach(x.clone(), words, scales, block_sums[0] if sums else None)


def copies_for(rows: int, cols: int, min_bytes: int = 256 << 20) -> int:
    """Distinct weights per timing: enough dense bf16 bytes that none is still in L2 when reused."""
    return max(2, -(-min_bytes // (2 * rows * cols)))


def graph_us(fn, copies: int, replays: int = 20) -> float:
    """Median microseconds per weight of ``fn`` (one pass over ``copies`` weights) replayed as a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / copies)
    return sorted(times)[len(times) // 2]


def _compile_job(job) -> str:
    for label, fn in variants(*job).items():
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a launch shape Triton cannot compile is reported, then skipped
            print(f"  {label}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}", flush=True)
    torch.cuda.synchronize()
    return f"{job[0]} {job[1]}x{job[2]} T={job[3]}"


def precompile(jobs: list[tuple]) -> None:
    """Run every variant once in worker processes, so Triton's on-disk cache holds every kernel."""
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(max_workers=min(12, len(jobs)), mp_context=context) as pool:
        for done in pool.map(_compile_job, jobs):
            print("compiled", done, flush=True)


def measure(name: str, rows: int, cols: int, tokens: int, sweep: bool, passes: int = 2) -> dict[str, float]:
    """Microseconds per weight for each variant: the best of ``passes`` interleaved graph timings."""
    copies = copies_for(rows, cols)
    return time_variants(variants(name, rows, cols, tokens, sweep, copies), copies, passes)


def time_variants(fns: dict, copies: int, passes: int = 2) -> dict[str, float]:
    """label -> microseconds per weight of ``fns[label]`` (one pass over ``copies`` weights): the best
    of ``passes`` interleaved CUDA-graph timings; an op that cannot be captured (one that syncs
    with the host) is timed launch by launch."""
    times: dict[str, float] = {}
    for _ in range(passes):
        for label, fn in fns.items():
            try:
                us = graph_us(fn, copies)
            except RuntimeError as exc:
                print(f"  {label}: not capturable ({str(exc).splitlines()[0][:80]}); timed with do_bench")
                torch.cuda.synchronize()
                from triton.testing import do_bench
                us = 1000 * do_bench(fn, warmup=5, rep=40, return_mode="median") / copies
            except Exception as exc:  # noqa: BLE001 - a shape Triton cannot compile (reported at precompile)
                print(f"  {label}: skipped ({type(exc).__name__})")
                continue
            times[label] = min(us, times.get(label, us))
    return times


def dequant_report(name: str, rows: int, cols: int) -> None:
    """Dequantize to bf16: Triton vs the torch reference (accuracy: tests/test_gguf_kernels.py -m gpu)."""
    from gguf import GGMLQuantizationType
    from triton.testing import do_bench
    from toolkit.kernels.gguf import reference, triton_ops
    qtype, data = int(GGMLQuantizationType[name]), random_packed(name, rows, cols)
    fast = 1000 * do_bench(lambda: triton_ops.gguf_dequantize(data, qtype, cols, torch.bfloat16), return_mode="median")
    slow = 1000 * do_bench(lambda: reference.gguf_dequantize(data, qtype, cols, torch.bfloat16), return_mode="median")
    gigabytes = (data.numel() + 2 * rows * cols) / 1e9
    print(f"| {name} | {rows}x{cols} | {fast:.1f} | {slow:.1f} | {slow / fast:.2f} | {gigabytes / fast * 1e6:.0f} |")


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy, counting bytes read plus bytes written (the ceiling)."""
    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    from triton.testing import do_bench
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * 4 / ms / 1e6


def packed_bytes(name: str, rows: int, cols: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    size, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    return rows * cols // size * nbytes


def report(name: str, rows: int, cols: int, tokens: int, times: dict[str, float], copy_gbs: float = 0.0) -> None:
    base = times["triton"]
    gbs = packed_bytes(name, rows, cols) / base / 1e3
    others = "  ".join(f"{label}={us:.1f}us" for label, us in times.items()
                       if label not in ("triton", "reference", "dense_bf16"))
    print(f"| {name} | {rows}x{cols} | {tokens} | {base:.1f} | {times['reference']:.1f} | "
          f"{times['dense_bf16']:.1f} | {times['reference'] / base:.2f} | {times['dense_bf16'] / base:.2f} | "
          f"{gbs:.0f} | {100 * gbs / copy_gbs:.0f}% | {others} |", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_K,Q8_0,Q4_0,Q6_K,Q5_K")
    parser.add_argument("--shapes", default="4096x4096,14336x4096,4096x14336")
    parser.add_argument("--tokens", default="1,8,512")
    parser.add_argument("--sweep", action="store_true", help="also time alternative launch configs")
    parser.add_argument("--no-precompile", action="store_true")
    parser.add_argument("--variants", default="", help="regex: time only the variants whose label matches "
                        "(besides triton, reference and dense_bf16)")
    parser.add_argument("--no-dequant-table", action="store_true", help="skip the dequantize timing table")
    args = parser.parse_args(argv)
    if args.variants:  # through the environment, so the precompile workers (spawned) see it too
        os.environ["BENCH_GGUF_VARIANTS"] = args.variants
        global VARIANT_FILTER
        VARIANT_FILTER = args.variants
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    jobs = [(name, rows, cols, int(tokens), args.sweep) for name in args.types.split(",")
            for rows, cols in shapes for tokens in args.tokens.split(",")]
    if not args.no_precompile:
        precompile(jobs)
    copy_gbs = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"device-to-device copy: {copy_gbs:.0f} GB/s (read + written)")
    print("| type | weight | T | triton us | reference us | dense bf16 us | reference/triton | dense/triton | "
          "triton GB/s (weights read) | of copy | variants |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for job in jobs:
        report(*job[:4], measure(*job), copy_gbs=copy_gbs)
    if args.no_dequant_table:
        return
    print("\n| type | weight | triton dequant us | reference dequant us | reference/triton | triton GB/s read+written |")
    print("|---|---|---|---|---|---|")
    for name in args.types.split(","):
        for rows, cols in shapes:
            dequant_report(name, rows, cols)


if __name__ == "__main__":
    main()
