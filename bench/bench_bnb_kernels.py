"""Benchmark the bitsandbytes Triton kernels on CUDA against bitsandbytes' own path (what the ops
ran before: ``matmul_4bit`` / LLM.int8) and a dense bf16 matmul of the same shape.

    python bench/bench_bnb_kernels.py                        # TinyLlama-1.1B's shapes, T = 1, 8, 16
    python bench/bench_bnb_kernels.py --tokens 1,2,4,8,16 --sweep   # also alternative launch configs
    python bench/bench_bnb_kernels.py --kinds nf4,int8 --tokens 8 --sweep-mma   # the tensor-core kernels' launches
    python bench/bench_bnb_kernels.py --kinds nf4 --shapes 4096x4096,14336x4096 --tokens 1,8

Columns: ``tokens`` is the token-unrolled GEMV (``triton_gemv_tokens``) at its table's launch for T
(``FOURBIT_TOKENS_CONFIG`` / ``INT8_TOKENS_CONFIG``), ``first`` the first Triton kernels
(``triton_kernels``) at their default launch, ``mma`` the tensor-core kernels (``triton_mma``) at
theirs (``mma_ops.FOURBIT_MMA_CONFIG`` / ``INT8_MMA_CONFIG``), then bitsandbytes and dense bf16. A shape whose rows are
a sum (``2048+256+256x2048``: TinyLlama's q/k/v, ``5632+5632x2048``: gate/up) is a fused projection:
``tokens`` runs its segments in one launch (statistics gathered as the bnb scheme lays them out),
bitsandbytes and ``first`` one call per segment plus a concatenation, as the scheme did before.

Shapes are ``rows x cols`` of the weight (``out x in``). Timing as bench_gguf_kernels.py does it:
each variant runs over enough distinct weights (>= 256 MB of dense bf16, beyond L2) inside one CUDA
graph; the median of 20 replays per weight, best of 2 interleaved passes. Variants bitsandbytes
cannot capture (LLM.int8 with a threshold) are timed launch by launch with ``do_bench`` instead.
Config labels: ``bm/bn/bk/warps/split[/fma]`` (split ``a``: automatic; fma: no ``tl.dot``) for the
first kernels; ``tok:bn/bk/warps/split[/lut256]`` for the token-unrolled GEMV;
``mma:bn/bk/warps/stages/split`` for the tensor-core kernels (``MMA_SWEEP``, with ``--sweep-mma``; split
``aN``: automatic, N programs per SM).
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import multiprocessing

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


# Token-unrolled GEMV alternatives for --sweep: (BN, BK, num_warps, split or None, lookup table).
# (The first kernels' own sweep, SWEEP, runs with --sweep-first.)
TOKENS_SWEEP = [(4, 1024, 4, None, 256), (8, 1024, 4, None, 16), (8, 1024, 4, None, 256), (2, 1024, 4, None, 16),
                (4, 512, 4, None, 16), (8, 512, 4, None, 16), (4, 2048, 8, None, 16), (4, 1024, 4, 1, 16)]


# Tensor-core kernel alternatives for --sweep-mma: (BN, BK, num_warps, num_stages, split K: a number, or "a" +
# programs per SM for the automatic split).
MMA_SWEEP = [(64, 128, 4, 4, 1), (64, 128, 4, 4, 2), (64, 128, 4, 4, 4), (64, 128, 4, 4, 8), (64, 128, 4, 3, 1),
             (64, 128, 4, 3, 2), (64, 128, 4, 3, 4), (64, 128, 4, 3, 8), (64, 256, 4, 4, 2), (64, 256, 4, 4, 4),
             (64, 128, 4, 4, "a4"), (64, 128, 4, 4, "a8")]


def weights(kind: str, segments: list[int], cols: int, copies: int):
    """``copies`` random weights of ``kind`` made of ``segments`` (rows each): (per-segment args after x
    for bitsandbytes' op, packed bytes of all segments, their QuantStates (gathered) or int8 data and
    scales, dense bf16 W)."""
    import bitsandbytes.functional as F
    from toolkit.plugins.quant.bnb.params4 import gather_states
    made = []
    for _ in range(copies):
        dense = torch.randn(sum(segments), cols, device="cuda", dtype=torch.bfloat16) * 0.02
        if kind == "int8":
            data, scb, _ = F.int8_vectorwise_quant(dense.half())
            made.append(([(data, scb)], None, (data, scb), dense))
            continue
        quant_type, nested = KINDS[kind]
        parts = [F.quantize_4bit(part.contiguous(), blocksize=64, quant_type=quant_type, compress_statistics=nested)
                 for part in dense.split(segments)]
        states = [state for _, state in parts]
        gather_states(states)
        packed = torch.cat([p.view(-1) for p, _ in parts])
        made.append(([(p.view(-1), state) for p, state in parts], packed, states, dense))
    return made


def variants(kind: str, segments: list[int], cols: int, tokens: int, sweep: bool, copies: int,
             sweep_first: bool = False, sweep_mma: bool = False) -> dict:
    """label -> callable computing ``[tokens, rows]`` once per weight copy."""
    from toolkit.kernels.bnb import mma_ops, triton_ops
    from toolkit.plugins.quant.bnb import kernels as bnb_path
    made = weights(kind, segments, cols, copies)
    x = torch.randn(tokens, cols, device="cuda", dtype=torch.bfloat16)
    int8 = kind == "int8"
    first = triton_ops.int8_matmul if int8 else triton_ops.fourbit_matmul

    def per_segment(fn):
        return lambda: [torch.cat([fn(x, *args) for args in parts], -1) for parts, _, _, _ in made]

    if int8:
        tokens_fn = lambda config=None, split=None: [triton_ops.int8_tokens_matmul(x, *stats, config, split)  # noqa: E731
                                                     for _, _, stats, _ in made]
        mma_fn = lambda config=None, split=None: [mma_ops.int8_mma_matmul(x, *stats, config, split)  # noqa: E731
                                                  for _, _, stats, _ in made]
        out = {"tokens": tokens_fn, "first": per_segment(first),
               "bnb_threshold0": per_segment(lambda x, *a: bnb_path.bnb_int8_matmul(x, *a, 0.0)),
               "bnb_threshold6": per_segment(lambda x, *a: bnb_path.bnb_int8_matmul(x, *a, 6.0))}
    else:
        tokens_fn = lambda config=None, split=None: [triton_ops.fourbit_tokens_matmul(x, packed, states, config, split)  # noqa: E731
                                                     for _, packed, states, _ in made]
        mma_fn = lambda config=None, split=None: [  # noqa: E731
            mma_ops.fourbit_mma_matmul(x, packed, states, config, split) for _, packed, states, _ in made]
        out = {"tokens": tokens_fn, "first": per_segment(first), "bnb": per_segment(bnb_path.bnb_4bit_matmul)}
    out["mma"] = mma_fn
    out["dense_bf16"] = lambda: [x @ w.T for _, _, _, w in made]
    for bn, bk, warps, stages, split in MMA_SWEEP if sweep_mma else ():
        steps = cols // bk
        if isinstance(split, int) and (steps % split or split > steps):
            continue
        config = mma_ops.MmaConfig(bn, bk, warps, stages, split=split if isinstance(split, int) else None,
                                   programs_per_sm=int(split[1:]) if isinstance(split, str) else 1)
        out[f"mma:{bn}/{bk}/{warps}/{stages}/{split}"] = lambda config=config: mma_fn(config)
    if not sweep:
        return out
    for bn, bk, warps, split, lut in TOKENS_SWEEP:
        if int8 and lut != 16:
            continue
        config = triton_ops.TokensConfig(bn, bk, warps, lut=lut)
        label = f"tok:{bn}/{bk}/{warps}/{split or 'a'}{'/lut256' if lut == 256 else ''}"
        out[label] = lambda config=config, split=split: tokens_fn(config, split)
    regime = "decode" if tokens == 1 else "small"
    for bm, bn, bk, warps, split, *dot in COMPARE[regime] + (SWEEP[regime] if sweep_first else []):
        if bm < tokens:
            continue
        config = triton_ops.MatmulConfig(bm, bn, bk, warps, dot=dot[0] if dot else True)
        label = f"{bm}/{bn}/{bk}/{warps}/{split or 'a'}{'' if config.dot else '/fma'}"
        out[label] = per_segment(lambda x, *args, config=config, split=split: first(x, *args, config, split))
    return out


def measure(kind: str, segments: list[int], cols: int, tokens: int, sweep: bool, sweep_first: bool,
            sweep_mma: bool = False, passes: int = 2) -> dict[str, float]:
    """Microseconds per weight for each variant (bitsandbytes' LLM.int8 syncs with the host: it is
    timed launch by launch)."""
    copies = copies_for(sum(segments), cols)
    return time_variants(variants(kind, segments, cols, tokens, sweep, copies, sweep_first, sweep_mma), copies,
                         passes)


def _compile_job(job) -> str:
    kind, segments, cols, tokens, sweep, sweep_first, sweep_mma = job
    for fn in variants(kind, segments, cols, tokens, sweep, 1, sweep_first, sweep_mma).values():
        fn()
    torch.cuda.synchronize()
    return f"{kind} {'+'.join(map(str, segments))}x{cols} T={tokens}"


def precompile(jobs: list[tuple]) -> None:
    """Run every variant once in worker processes, so Triton's on-disk cache holds every kernel
    (the unrolled token kernels take seconds each to compile)."""
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(max_workers=min(12, len(jobs)), mp_context=context) as pool:
        for done in pool.map(_compile_job, jobs):
            print("compiled", done, flush=True)


def weight_bytes(kind: str, rows: int, cols: int) -> int:
    if kind == "int8":
        return rows * cols + 4 * rows
    return rows * cols // 2 + rows * cols // 64 * (1 if kind.endswith("-dq") else 4)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="nf4,nf4-dq,int8")
    # TinyLlama 1.1B: q/k/v 2048+256+256 x 2048 (fused), o 2048x2048, gate/up 5632+5632 x 2048 (fused),
    # down 2048x5632
    parser.add_argument("--shapes", default="2048+256+256x2048,2048x2048,5632+5632x2048,2048x5632")
    parser.add_argument("--tokens", default="1,8,16")
    parser.add_argument("--sweep", action="store_true", help="also time the token GEMV's alternative launches")
    parser.add_argument("--sweep-first", action="store_true", help="also time the first kernels' alternatives")
    parser.add_argument("--sweep-mma", action="store_true", help="also time the tensor-core kernels' alternatives")
    parser.add_argument("--no-precompile", action="store_true", help="compile in this process, as variants run")
    args = parser.parse_args(argv)
    shapes = []
    for shape in args.shapes.split(","):
        rows, cols = shape.split("x")
        shapes.append(([int(r) for r in rows.split("+")], int(cols)))
    token_counts = [int(t) for t in args.tokens.split(",")]
    if not args.no_precompile:
        precompile([(kind, segments, cols, tokens, args.sweep, args.sweep_first, args.sweep_mma)
                    for kind in args.kinds.split(",")
                    for segments, cols in shapes for tokens in token_counts])
    copy_gbs = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"device-to-device copy: {copy_gbs:.0f} GB/s (read + written)")
    print("| kind | weight | T | tokens us | first us | mma us | bitsandbytes us | dense bf16 us | bnb/tokens | "
          "tokens/dense | mma/dense | tokens GB/s | other variants (us) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        for segments, cols in shapes:
            rows = sum(segments)
            for tokens in token_counts:
                times = measure(kind, segments, cols, tokens, args.sweep, args.sweep_first, args.sweep_mma)
                base, first, dense, mma = times["tokens"], times["first"], times["dense_bf16"], times["mma"]
                bnb = times.get("bnb", times.get("bnb_threshold0"))
                others = "  ".join(f"{label}={us:.1f}" for label, us in sorted(times.items(), key=lambda kv: kv[1])
                                   if label not in ("tokens", "first", "mma", "dense_bf16", "bnb", "bnb_threshold0"))
                name = "+".join(map(str, segments))
                print(f"| {kind} | {name}x{cols} | {tokens} | {base:.1f} | {first:.1f} | {mma:.1f} | {bnb:.1f} | "
                      f"{dense:.1f} | {bnb / base:.2f} | {base / dense:.2f} | {mma / dense:.2f} | "
                      f"{weight_bytes(kind, rows, cols) / base / 1e3:.0f} | "
                      f"{others} |", flush=True)


if __name__ == "__main__":
    main()
