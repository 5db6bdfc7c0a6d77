"""Where a decode step's GPU time goes: torch.profiler over eager decode steps of the engine.

Eager (no CUDA graph) so the profiler sees every kernel; the kernels are the ones the graphs
replay. Prints the top kernels by GPU time per step and the number of kernels per step, and the wall time
per step of as many steps run just before, unprofiled (where it exceeds the timeline's span, the host holds the
GPU back).
``--graphs`` profiles the replayed CUDA graphs instead: the kernels' own times are the same, but the
timeline then also shows what the step costs beyond them (the GPU idle between kernels, or kernels
overlapping under PDL), which eager launches hide behind their host time.

    python bench/profile_decode.py MODEL.gguf --batch 1 --steps 8
    python bench/profile_decode.py MODEL.gguf --batch 8 --graphs --sequence 12
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--prefill", type=int, default=0, help="profile prefills of this many tokens instead")
    parser.add_argument("--sequence", type=int, default=0,
                        help="also print the first N kernels of the last step in launch order (one layer's sequence)")
    parser.add_argument("--graphs", action="store_true", help="profile CUDA-graph replays (decode only)")
    parser.add_argument("--max-num-seqs", type=int, default=0,
                        help="the engine's max_num_seqs (default: --batch), as `toolkit bench` sets it to its largest")
    args = parser.parse_args()

    import toolkit  # noqa: PLC0415
    from toolkit.core.engine import benchmark  # noqa: PLC0415

    llm = toolkit.LLM(args.model, device="cuda", max_num_seqs=args.max_num_seqs or args.batch,
                      enable_prefix_caching=False, enforce_eager=not args.graphs, kv_cache_memory="4GiB")
    benchmark.measure(llm, args.batch, 128, 4)                      # warm-up: compile every kernel
    if args.prefill:
        profile_prefill(llm, args)
        return
    prompts = benchmark.random_prompts(args.batch, 128, llm.config.vocab_size, 1)
    params = toolkit.SamplingParams(max_tokens=2 * args.steps + 1, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        llm.add_request(prompt, params)
    llm.step()                                                      # prefill, outside the profile
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):                                     # wall time of as many steps, unprofiled
        llm.step()
    torch.cuda.synchronize()
    plain_ms = (time.perf_counter() - start) / args.steps * 1e3
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            llm.step()
        torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) / args.steps * 1e3      # with the profiler's own overhead
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.self_device_time_total for e in events) / args.steps
    kernels = sum(e.count for e in events) / args.steps
    print(f"{args.model} batch {args.batch}: {total_us / 1e3:.2f} ms of GPU kernels per step, "
          f"{kernels:.0f} kernels/step, wall time per step {plain_ms:.2f} ms "
          f"({wall_ms:.2f} ms profiled, the next {args.steps} steps)")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:args.top]:
        print(f"  {e.self_device_time_total / args.steps / 1e3:7.3f} ms  x{e.count / args.steps:5.0f}  {e.key[:110]}")
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    print_timeline(kernels, args)
    if args.sequence:
        print_sequence(kernels, args)


def print_timeline(kernels, args) -> None:
    """Where the steps' wall time went on the GPU: kernels running, idle gaps between kernels (short: launch
    latency inside a step; long: waiting for the host between steps), and overlap (PDL lets a kernel start
    before the one before it ends)."""
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    short = long = overlap = 0.0
    end = kernels[0].time_range.end
    for e in kernels[1:]:
        gap = e.time_range.start - end
        if gap > 20:
            long += gap
        elif gap > 0:
            short += gap
        else:
            overlap -= gap
        end = max(end, e.time_range.end)
    n = args.steps
    print(f"timeline per step: span {span / n / 1e3:.3f} ms; gaps under 20 us {short / n / 1e3:.3f} ms, "
          f"longer gaps {long / n / 1e3:.3f} ms, overlapped {overlap / n / 1e3:.3f} ms")


def print_sequence(kernels, args) -> None:
    """The kernels of the last profiled step in launch order: shows what one layer launches, each with the
    GPU's idle time before it (negative: it started while the previous kernel still ran)."""
    per_step = len(kernels) // args.steps
    print(f"launch order, last step ({per_step} kernels), first {args.sequence}: us, gap before, name")
    last = kernels[-per_step:]
    for prev, e in zip(last, last[1:args.sequence + 1]):
        print(f"  {e.time_range.elapsed_us():7.1f} {e.time_range.start - prev.time_range.end:6.1f}  {e.name[:110]}")


def profile_prefill(llm, args) -> None:
    """Host (cProfile) and device (torch.profiler) time of ``--steps`` prefills of one prompt."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415
    from toolkit.core.engine import benchmark  # noqa: PLC0415

    benchmark.measure(llm, 1, args.prefill, 1, seed=1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(args.steps):
        benchmark.measure(llm, 1, args.prefill, 1, seed=2 + i)
    torch.cuda.synchronize()
    print(f"prefill {args.prefill}: {(time.perf_counter() - start) / args.steps * 1e3:.2f} ms per request (wall)")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(args.steps):
            benchmark.measure(llm, 1, args.prefill, 1, seed=50 + i)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"GPU kernels: {sum(e.self_device_time_total for e in events) / args.steps / 1e3:.2f} ms per prefill, "
          f"{sum(e.count for e in events) / args.steps:.0f} kernels")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:args.top]:
        print(f"  {e.self_device_time_total / args.steps / 1e3:7.3f} ms  x{e.count / args.steps:5.0f}  {e.key[:100]}")
    host = cProfile.Profile()
    host.enable()
    for i in range(args.steps):
        benchmark.measure(llm, 1, args.prefill, 1, seed=100 + i)
    host.disable()
    pstats.Stats(host).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
