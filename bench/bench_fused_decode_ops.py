"""GPU time of a decode layer's small ops, fused against unfused, in one process (CUDA only).

Each variant is captured in a CUDA graph of ``--repeat`` back-to-back copies (as a decode step
replays them) and timed by CUDA events; the figure is the median over ``--trials`` replays,
per copy. Variants, at one model's shapes (defaults: Qwen2.5-1.5B, 12 q heads, 2 kv heads,
head_dim 128, hidden 1536, bf16):

* ``rotary_qk + store_kv`` (two kernels) against ``rotary_store_kv`` (one);
* ``x + residual`` then ``rms_norm`` (a torch add and a kernel) against ``add_rms_norm`` (one).

    python bench/bench_fused_decode_ops.py --tokens 1
"""
from __future__ import annotations

import argparse
import statistics

import torch


def timed(fn, repeat: int, trials: int) -> float:
    """Median microseconds per call of ``fn`` replayed from a CUDA graph of ``repeat`` calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(repeat):
            fn()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / repeat)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--trials", type=int, default=21)
    args = parser.parse_args()

    from toolkit.core.registry import default_registry  # noqa: PLC0415
    from toolkit.kernels import runtime  # noqa: PLC0415

    default_registry()
    dev, dtype, hd, t = "cuda", torch.bfloat16, args.head_dim, args.tokens
    qkv = torch.randn(t, (args.heads + 2 * args.kv_heads) * hd, device=dev, dtype=dtype)
    q, k, v = qkv.split([args.heads * hd, args.kv_heads * hd, args.kv_heads * hd], dim=-1)
    k_cache = torch.zeros(256, 16, args.kv_heads, hd, device=dev, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    positions = torch.arange(40, 40 + t, device=dev)
    slots = torch.arange(100, 100 + t, device=dev)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    kv_shape = (t, args.kv_heads, hd)

    def unfused_rotary():
        q_rot, k_rot = runtime.call("rotary_qk", positions, q, k, inv_freq, hd, hd)
        runtime.call("store_kv", k_rot.view(kv_shape), v.view(kv_shape), k_cache, v_cache, slots)

    def fused_rotary():
        runtime.call("rotary_store_kv", positions, q, k, v, inv_freq, hd, hd, k_cache, v_cache, slots)

    x = torch.randn(t, args.hidden, device=dev, dtype=dtype)
    residual = torch.randn_like(x)
    weight = torch.ones(args.hidden, device=dev, dtype=dtype)

    def unfused_norm():
        runtime.call("rms_norm", x + residual, weight, 1e-6, 0.0)

    def fused_norm():
        runtime.call("add_rms_norm", x, residual, weight, 1e-6, 0.0)

    device = torch.cuda.get_device_name()
    print(f"{device}, {t} token(s), bf16, median of {args.trials} graph replays x {args.repeat} calls")
    for name, a, b in (("rotary_qk + store_kv -> rotary_store_kv", unfused_rotary, fused_rotary),
                       ("add + rms_norm -> add_rms_norm", unfused_norm, fused_norm)):
        before, after = timed(a, args.repeat, args.trials), timed(b, args.repeat, args.trials)
        print(f"  {name}: {before:6.2f} us -> {after:6.2f} us  (ratio {after / before:.2f})")


if __name__ == "__main__":
    main()
