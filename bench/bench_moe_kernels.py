"""Time the Triton fused MoE at Qwen3-30B-A3B's layer shape (Q4_K gate/up, Q6_K down, top-8 of 128 experts).

Usage (on a CUDA device):
    python bench/bench_moe_kernels.py                        # the dispatched kernels, T = 1, 8, 32, 64, 512
    python bench/bench_moe_kernels.py --ab                   # route blocks: int8 tensor cores vs the float kernel
    python bench/bench_moe_kernels.py --ab --bm 16,32,64     # ... at several route-block sizes (BM)
    python bench/bench_moe_kernels.py --ab --sweep           # ... and more int8 launches (BN, warps, stages)
    python bench/bench_moe_kernels.py --ab --down Q4_K       # another down type (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K)
    python bench/bench_moe_kernels.py --ab --routes 16,64,256,512,1024 --bm 1,16,32   # route counts: where int8 pays
    python bench/bench_moe_kernels.py --route-sweep --tokens 1,8   # one route per program: other launches


One MoE layer's experts are ~390 MB, beyond any L2 cache, so one layer per graph replay. ``--ab`` times the
variants interleaved (best of 2 passes of 20-replay medians) and prints each one's largest difference from
the float kernel's output relative to that output's largest magnitude (int8 rounding: ~1e-2 expected).
Each ``--ab`` variant forces its kernel whatever the route count: BM=1 is one route per program (the dp4a GEMV
the dispatch takes up to ``DECODE_ROUTES``), BM >= 16 route blocks of that size even below that limit or from
``LARGE_BLOCKS`` on. ``--routes`` names route counts (top-8: tokens = routes / 8) instead of ``--tokens``; it
ends with the table ``triton_moe.MOE_INT8_ROUTES`` is read from (int8 over float, each at its best BM).
"""
from __future__ import annotations

import argparse
import os

import torch
from gguf import GGMLQuantizationType as Q

from bench_gguf_kernels import time_variants
from toolkit.kernels import moe_triton, runtime
from toolkit.kernels.gguf_moe import triton_moe
from toolkit.kernels.gguf_quant import quantize

E, H, I, K = 128, 2048, 768, 8


def layer(gate_up_type: str, down_type: str):
    g = torch.Generator(device="cuda").manual_seed(0)
    gu = quantize(torch.randn(E * 2 * I, H, device="cuda", generator=g) * 0.02, Q[gate_up_type])
    dn = quantize(torch.randn(E * H, I, device="cuda", generator=g) * 0.02, Q[down_type])
    return gu, int(Q[gate_up_type]), dn, int(Q[down_type])


def expert_gigabytes(tokens: int, gu, dn) -> float:
    return min(E, tokens * K) * (gu.shape[0] // E * gu.shape[1] + dn.shape[0] // E * dn.shape[1]) / 1e9


def route_variant(fn, args, launches: dict):
    """``fn(*args)`` one route per program with ``triton_moe.DP4A_ROUTE`` updated by ``launches`` while it runs."""
    def run():
        saved = dict(triton_moe.DP4A_ROUTE), moe_triton.DECODE_ROUTES
        triton_moe.DP4A_ROUTE.update(launches)
        moe_triton.DECODE_ROUTES = 1 << 30
        try:
            return fn(*args)
        finally:
            triton_moe.DP4A_ROUTE.clear()
            triton_moe.DP4A_ROUTE.update(saved[0])
            moe_triton.DECODE_ROUTES = saved[1]
    return run


# one route per program (BN, BK, warps): gate_up's type ("default") and down's Q6_K, each varied alone
ROUTE_SWEEP = {"default": [(2, 2048, 1), (4, 2048, 2), (2, 1024, 1), (4, 1024, 1), (4, 2048, 4), (8, 1024, 2)],
               "Q6_K": [(1, 256, 1), (4, 256, 1), (4, 256, 2), (8, 256, 2), (2, 256, 2)]}


def variant(fn, args, int8: bool, bm: int, config=None):
    """``fn(*args)`` with BM routes a program (1: one route per program; else route blocks of BM, on int8
    tensor cores or not, and an int8 launch ``(BN, warps, stages)``), whatever the route count; the settings
    hold while the graph is captured (what it replays)."""
    def run():
        saved = (os.environ.get("TOOLKIT_MOE_INT8"), moe_triton.BM_GROUPED, dict(triton_moe.MMQ_ROUTE),
                 moe_triton.DECODE_ROUTES, triton_moe.LARGE_BLOCKS)
        os.environ["TOOLKIT_MOE_INT8"] = "1" if int8 else "0"
        moe_triton.BM_GROUPED = bm
        moe_triton.DECODE_ROUTES = 1 << 30 if bm == 1 else 0
        triton_moe.LARGE_BLOCKS = None
        if config:
            triton_moe.MMQ_ROUTE.update({name: config for name in (*triton_moe.MMQ_ROUTE, "default")})
        try:
            return fn(*args)
        finally:
            if saved[0] is None:
                os.environ.pop("TOOLKIT_MOE_INT8")
            else:
                os.environ["TOOLKIT_MOE_INT8"] = saved[0]
            moe_triton.BM_GROUPED = saved[1]
            triton_moe.MMQ_ROUTE.clear()
            triton_moe.MMQ_ROUTE.update(saved[2])
            moe_triton.DECODE_ROUTES, triton_moe.LARGE_BLOCKS = saved[3], saved[4]
    return run


SWEEP = [(32, 2, 3), (64, 4, 2), (64, 8, 3), (128, 4, 3), (128, 8, 3)]   # int8 launches: BN, warps, stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,8,32,64,512")
    parser.add_argument("--routes", help="route counts instead of --tokens (multiples of top-k 8)")
    parser.add_argument("--ab", action="store_true", help="route blocks: int8 tensor cores vs the float kernel")
    parser.add_argument("--bm", default="16", help="route-block sizes (BM) for --ab, comma-separated")
    parser.add_argument("--sweep", action="store_true", help="with --ab: more int8 launches (BN, warps, stages)")
    parser.add_argument("--route-sweep", action="store_true",
                        help="one route per program: other (BN, BK, warps) launches (TOOLKIT_MOE_ROUTE_LAUNCH form)")
    parser.add_argument("--gate-up", default="Q4_K")
    parser.add_argument("--down", default="Q6_K")
    opts = parser.parse_args()
    gu, gu_type, dn, dn_type = layer(opts.gate_up, opts.down)
    print(f"{torch.cuda.get_device_name()}: E={E} H={H} I={I} top-{K}, gate_up {opts.gate_up}, down {opts.down}; "
          f"int8 launch {triton_moe.MMQ_ROUTE} (BN, warps, stages)")
    if opts.routes:
        counts = [int(r) for r in opts.routes.split(",")]
        assert all(r % K == 0 for r in counts), f"--routes: multiples of top-k {K}"
        token_counts = [r // K for r in counts]
    else:
        token_counts = [int(t) for t in opts.tokens.split(",")]
    summary = []
    for tokens in token_counts:
        x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
        w, ids = runtime.call("moe_route", torch.randn(tokens, E, device="cuda"), K, True)
        args = (x, gu, gu_type, dn, dn_type, w, ids)
        fn = runtime.resolve("gguf_fused_moe", *args)
        gigabytes = expert_gigabytes(tokens, gu, dn)
        if opts.route_sweep:
            fns = {"route " + ";".join(f"{k}={','.join(map(str, v))}" for k, v in triton_moe.DP4A_ROUTE.items()):
                   route_variant(fn, args, {})}
            for name, launches in ROUTE_SWEEP.items():
                for launch in launches:
                    fns[f"route {name}={','.join(map(str, launch))}"] = route_variant(fn, args, {name: launch})
            reference = variant(fn, args, False, 16)().float()
            for label, run in list(fns.items()):
                error = (run().float() - reference).abs().max().item() / reference.abs().max().item()
                assert error < 5e-2, (label, error)          # int8 rounding, not a wrong launch
            times = time_variants(fns, 1)
            print(f"T={tokens} ({tokens * K} routes), one route per program, ms per layer:")
            for label, us in sorted(times.items(), key=lambda item: item[1]):
                print(f"  {label:40s} {us / 1000:7.3f} ms  ~{gigabytes / us * 1e6:5.0f} GB/s")
            continue
        if not opts.ab:
            us = time_variants({"dispatched": lambda: fn(*args)}, 1)["dispatched"]
            print(f"T={tokens:4d} triton fused MoE (CUDA graph) {us / 1000:.3f} ms  ~{gigabytes / us * 1e6:.0f} GB/s "
                  f"of expert bytes")
            continue
        fns = {}
        for bm in (int(b) for b in opts.bm.split(",")):
            if bm == 1:
                fns["route/program BM=1"] = variant(fn, args, False, 1)
                continue
            fns[f"float BM={bm}"] = variant(fn, args, False, bm)
            fns[f"int8 BM={bm}"] = variant(fn, args, True, bm)
            for config in SWEEP if opts.sweep else ():
                fns[f"int8 BM={bm} BN={config[0]} w{config[1]} s{config[2]}"] = variant(fn, args, True, bm, config)
        reference = variant(fn, args, False, 16)().float()
        scale = reference.abs().max().item()
        diffs = {}
        for label, run in list(fns.items()):
            try:
                diffs[label] = (run().float() - reference).abs().max().item() / scale
            except Exception as exc:  # a launch Triton cannot compile (shared memory, layouts): report, go on
                print(f"  {label}: failed ({str(exc).splitlines()[0][:100]})")
                del fns[label]
        times = time_variants(fns, 1)
        base = times.get("float BM=16", min(times.values()))
        print(f"T={tokens} ({tokens * K} routes), ms per layer, speedup over float BM=16, max |diff| / max |y|:")
        for label, us in sorted(times.items(), key=lambda item: item[1]):
            print(f"  {label:32s} {us / 1000:7.3f} ms  {base / us:5.2f}x  ~{gigabytes / us * 1e6:5.0f} GB/s  "
                  f"diff {diffs[label]:.1e}")
        best = {kind: min(((us, label) for label, us in times.items() if label.startswith(kind)), default=None)
                for kind in ("float", "int8", "route/program")}
        summary.append((tokens * K, best))
    if summary:
        print("\nroutes | float (best BM) ms | int8 (best BM) ms | int8 speedup | one route/program ms")
        for routes, best in summary:
            flt, i8, one = best["float"], best["int8"], best["route/program"]
            speedup = f"{flt[0] / i8[0]:.2f}x" if flt and i8 else "-"
            cells = [f"{b[0] / 1000:.3f} ({b[1].split(' ', 1)[1]})" if b else "-" for b in (flt, i8)]
            print(f"{routes:6d} | {cells[0]} | {cells[1]} | {speedup} | " + (f"{one[0] / 1000:.3f}" if one else "-"))
        wins = [routes for routes, best in summary if best["float"] and best["int8"]
                and best["int8"][0] < 0.98 * best["float"][0]]
        print(f"int8 ahead by > 2% at routes {wins}: MOE_INT8_ROUTES = "
              f"{(min(wins), max(wins)) if wins else None} if those are contiguous (check the rows between)")


if __name__ == "__main__":
    main()
