"""Benchmark the GGUF kernels on CUDA: Triton (as the runtime dispatches it) vs the torch reference
(dequantize + matmul) vs a dense bf16 matmul of the same shape. Reports ratios, not targets.

    python bench/bench_gguf_kernels.py                      # default types, shapes, token counts
    python bench/bench_gguf_kernels.py --sweep              # also time more launch configs
    python bench/bench_gguf_kernels.py --types Q4_K --shapes 4096x4096 --tokens 1,8,512

Shapes are ``rows x cols`` of the weight (``out x in``); ``y[T, rows] = x[T, cols] @ W.T``.
Times are medians of ``triton.testing.do_bench`` (which flushes L2 between calls, so weights
come from HBM as in a real forward pass). Kernels are compiled first in parallel processes.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import multiprocessing

import torch

# fp16 scale fields per type (ggml block structs): random blocks get small finite scales there.
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,),
               "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}
# (BM, BN, BK, num_warps, split-K or None for automatic). COMPARE runs by default, SWEEP with --sweep.
COMPARE = {"decode": [(1, 16, 256, 4, None), (1, 8, 512, 4, None)], "small": [(16, 32, 128, 4, None)],
           "prefill": [(128, 64, 64, 4, 1)]}
SWEEP = {"decode": [(1, 16, 256, 4, 1), (1, 32, 256, 4, 1), (1, 16, 128, 4, 1), (1, 16, 256, 8, 1),
                    (1, 16, 512, 4, None), (1, 8, 512, 8, None)],
         "small": [(16, 16, 256, 4, None), (16, 64, 64, 4, 1), (16, 32, 256, 8, 1), (16, 64, 128, 4, None)],
         "prefill": [(128, 128, 64, 8, 1)]}


def random_packed(name: str, rows: int, cols: int) -> torch.Tensor:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    size, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    blocks = torch.randint(0, 256, (rows * cols // size, nbytes), dtype=torch.uint8, device="cuda")
    for offset in FP16_FIELDS[name]:
        scale = (torch.rand(blocks.shape[0], 1, device="cuda") * 0.02 - 0.01).half()
        blocks[:, offset:offset + 2] = scale.view(torch.uint8)
    return blocks.view(rows, -1)


def variants(name: str, rows: int, cols: int, tokens: int, sweep: bool) -> dict:
    """label -> zero-argument callable, all computing the same ``[tokens, rows]`` product."""
    from gguf import GGMLQuantizationType
    from toolkit.kernels.gguf import reference, triton_ops
    qtype = int(GGMLQuantizationType[name])
    data = random_packed(name, rows, cols)
    x = torch.randn(tokens, cols, device="cuda", dtype=torch.bfloat16)
    dense = reference.gguf_dequantize(data, qtype, cols, torch.bfloat16)
    out = {"triton": lambda: triton_ops.gguf_matmul(x, data, qtype, cols),
           "reference": lambda: reference.gguf_matmul(x, data, qtype, cols),
           "dense_bf16": lambda: x @ dense.T}
    regime = "decode" if tokens == 1 else "small" if tokens <= 16 else "prefill"
    for bm, bn, bk, warps, split in COMPARE[regime] + (SWEEP[regime] if sweep else []):
        config = triton_ops.MatmulConfig(bm=bm, bn=bn, bk=bk, num_warps=warps)
        out[f"fused{bm}x{bn}x{bk}w{warps}s{split or 'auto'}"] = (
            lambda c=config, s=split: triton_ops.fused_matmul(x, data, qtype, cols, c, split=s))
    if regime == "prefill":
        out["triton_dequant+mm"] = lambda: x @ triton_ops.gguf_dequantize(data, qtype, cols, x.dtype).T
    else:  # the element-wise tiles, to show what the word-wise ones buy
        config = triton_ops.DECODE_CONFIG if tokens == 1 else triton_ops.SMALL_BATCH_CONFIG
        out["elementwise"] = lambda: triton_ops.fused_matmul(x, data, qtype, cols, config, words=False)
    return out


def _compile_job(job) -> str:
    for fn in variants(*job).values():
        fn()
    torch.cuda.synchronize()
    return f"{job[0]} {job[1]}x{job[2]} T={job[3]}"


def precompile(jobs: list[tuple]) -> None:
    """Run every variant once in worker processes, so Triton's on-disk cache holds every kernel."""
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(max_workers=min(12, len(jobs)), mp_context=context) as pool:
        for done in pool.map(_compile_job, jobs):
            print("compiled", done, flush=True)


def measure(name: str, rows: int, cols: int, tokens: int, sweep: bool, passes: int = 2) -> dict[str, float]:
    """Microseconds per variant: the best of ``passes`` interleaved medians (single runs on the
    device varied by up to 2x between identical launches)."""
    from triton.testing import do_bench
    fns = variants(name, rows, cols, tokens, sweep)
    times: dict[str, float] = {}
    for _ in range(passes):
        for label, fn in fns.items():
            us = 1000 * do_bench(fn, warmup=10, rep=40, return_mode="median")
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


def report(name: str, rows: int, cols: int, tokens: int, times: dict[str, float]) -> None:
    base = times["triton"]
    others = "  ".join(f"{label}={us:.1f}us" for label, us in times.items()
                       if label not in ("triton", "reference", "dense_bf16"))
    print(f"| {name} | {rows}x{cols} | {tokens} | {base:.1f} | {times['reference']:.1f} | "
          f"{times['dense_bf16']:.1f} | {times['reference'] / base:.2f} | {times['dense_bf16'] / base:.2f} | "
          f"{others} |", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_K,Q8_0,Q4_0,Q6_K")
    parser.add_argument("--shapes", default="4096x4096,14336x4096,4096x14336")
    parser.add_argument("--tokens", default="1,8,512")
    parser.add_argument("--sweep", action="store_true", help="also time alternative launch configs")
    parser.add_argument("--no-precompile", action="store_true")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    jobs = [(name, rows, cols, int(tokens), args.sweep) for name in args.types.split(",")
            for rows, cols in shapes for tokens in args.tokens.split(",")]
    if not args.no_precompile:
        precompile(jobs)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print("| type | weight | T | triton us | reference us | dense bf16 us | reference/triton | dense/triton | "
          "variants |")
    print("|---|---|---|---|---|---|---|---|---|")
    for job in jobs:
        report(*job[:4], measure(*job))
    print("\n| type | weight | triton dequant us | reference dequant us | reference/triton | triton GB/s read+written |")
    print("|---|---|---|---|---|---|")
    for name in args.types.split(","):
        for rows, cols in shapes:
            dequant_report(name, rows, cols)


if __name__ == "__main__":
    main()
