"""Benchmark the bitsandbytes Triton kernels on CUDA against bitsandbytes' own path (what the ops
ran before: ``matmul_4bit`` / LLM.int8) and a dense bf16 matmul of the same shape.

    python bench/bench_bnb_kernels.py                        # TinyLlama-1.1B's shapes, T = 1, 8, 16
    python bench/bench_bnb_kernels.py --sweep                # also time alternative launch configs
    python bench/bench_bnb_kernels.py --kinds nf4 --shapes 4096x4096,14336x4096 --tokens 1,8

Shapes are ``rows x cols`` of the weight (``out x in``). Timing as bench_gguf_kernels.py does it:
each variant runs over enough distinct weights (>= 256 MB of dense bf16, beyond L2) inside one CUDA
graph; the median of 20 replays per weight, best of 2 interleaved passes. Variants bitsandbytes
cannot capture (LLM.int8 with a threshold) are timed launch by launch with ``do_bench`` instead.
Config labels: ``bm/bn/bk/warps/split[/fma]`` (split ``a``: automatic; fma: no ``tl.dot``).
"""
from __future__ import annotations

import argparse

import torch

from bench_gguf_kernels import copies_for, copy_bandwidth, time_variants

KINDS = {"nf4": ("nf4", False), "nf4-dq": ("nf4", True), "fp4": ("fp4", False), "int8": None}
# (BM, BN, BK, num_warps, split or None for automatic, tl.dot), by regime; --sweep adds SWEEP's.
# BM < 16 needs tl.dot off (float32 multiply-accumulate per token); "small" ones run at T = 2..16.
COMPARE = {"decode": [], "small": [(8, 4, 256, 4, None, False)]}
SWEEP = {"decode": [(1, 4, 512, 4, None), (1, 16, 512, 4, None), (1, 8, 1024, 4, None), (1, 8, 256, 4, None),
                    (1, 8, 512, 8, None), (1, 4, 1024, 2, None), (1, 8, 512, 4, 1), (1, 2, 1024, 1, None)],
         "small": [(16, 32, 128, 4, None), (16, 16, 256, 4, None), (16, 64, 64, 4, None), (16, 32, 256, 4, None),
                   (16, 64, 128, 8, None), (16, 64, 128, 4, 1), (16, 16, 512, 4, None),
                   (8, 2, 512, 4, None, False), (8, 8, 128, 4, None, False), (16, 4, 128, 4, None, False),
                   (8, 4, 256, 8, None, False)]}


def weights(kind: str, rows: int, cols: int, copies: int):
    """``copies`` random weights of ``kind``: (args after x for the op, dense bf16 W)."""
    import bitsandbytes.functional as F
    made = []
    for _ in range(copies):
        dense = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 0.02
        if kind == "int8":
            data, scb, _ = F.int8_vectorwise_quant(dense.half())
            made.append(((data, scb), dense))
        else:
            quant_type, nested = KINDS[kind]
            packed, state = F.quantize_4bit(dense, blocksize=64, quant_type=quant_type, compress_statistics=nested)
            made.append(((packed.view(-1), state), dense))
    return made


def variants(kind: str, rows: int, cols: int, tokens: int, sweep: bool, copies: int) -> dict:
    """label -> callable computing ``[tokens, rows]`` once per weight copy."""
    from toolkit.kernels.bnb import triton_ops
    from toolkit.plugins.quant.bnb import kernels as bnb_path
    made = weights(kind, rows, cols, copies)
    x = torch.randn(tokens, cols, device="cuda", dtype=torch.bfloat16)
    int8 = kind == "int8"
    fused = triton_ops.int8_matmul if int8 else triton_ops.fourbit_matmul
    out = {"triton": lambda: [fused(x, *args) for args, _ in made],
           "dense_bf16": lambda: [x @ w.T for _, w in made]}
    if int8:
        out["bnb_threshold0"] = lambda: [bnb_path.bnb_int8_matmul(x, *args, 0.0) for args, _ in made]
        out["bnb_threshold6"] = lambda: [bnb_path.bnb_int8_matmul(x, *args, 6.0) for args, _ in made]
    else:
        out["bnb"] = lambda: [bnb_path.bnb_4bit_matmul(x, *args) for args, _ in made]
    regime = "decode" if tokens == 1 else "small"
    for bm, bn, bk, warps, split, *dot in COMPARE[regime] + (SWEEP[regime] if sweep else []):
        if bm < tokens:
            continue
        config = triton_ops.MatmulConfig(bm, bn, bk, warps, dot=dot[0] if dot else True)
        label = f"{bm}/{bn}/{bk}/{warps}/{split or 'a'}{'' if config.dot else '/fma'}"
        out[label] = lambda config=config, split=split: [fused(x, *args, config, split) for args, _ in made]
    return out


def measure(kind: str, rows: int, cols: int, tokens: int, sweep: bool, passes: int = 2) -> dict[str, float]:
    """Microseconds per weight for each variant (bitsandbytes' LLM.int8 syncs with the host: it is
    timed launch by launch)."""
    copies = copies_for(rows, cols)
    return time_variants(variants(kind, rows, cols, tokens, sweep, copies), copies, passes)


def weight_bytes(kind: str, rows: int, cols: int) -> int:
    if kind == "int8":
        return rows * cols + 4 * rows
    return rows * cols // 2 + rows * cols // 64 * (1 if kind.endswith("-dq") else 4)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="nf4,nf4-dq,int8")
    # TinyLlama 1.1B: q/o 2048x2048, k/v 256x2048, gate/up 5632x2048, down 2048x5632
    parser.add_argument("--shapes", default="2048x2048,256x2048,5632x2048,2048x5632")
    parser.add_argument("--tokens", default="1,8,16")
    parser.add_argument("--sweep", action="store_true", help="also time alternative launch configs")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    copy_gbs = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"device-to-device copy: {copy_gbs:.0f} GB/s (read + written)")
    print("| kind | weight | T | triton us | bitsandbytes us | dense bf16 us | bnb/triton | triton/dense | "
          "triton GB/s | other variants (us) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        for rows, cols in shapes:
            for tokens in (int(t) for t in args.tokens.split(",")):
                times = measure(kind, rows, cols, tokens, args.sweep)
                base, dense = times["triton"], times["dense_bf16"]
                bnb = times.get("bnb", times.get("bnb_threshold0"))
                others = "  ".join(f"{label}={us:.1f}" for label, us in times.items()
                                   if label not in ("triton", "dense_bf16", "bnb", "bnb_threshold0"))
                print(f"| {kind} | {rows}x{cols} | {tokens} | {base:.1f} | {bnb:.1f} | {dense:.1f} | "
                      f"{bnb / base:.2f} | {base / dense:.2f} | {weight_bytes(kind, rows, cols) / base / 1e3:.0f} | "
                      f"{others} |", flush=True)


if __name__ == "__main__":
    main()
