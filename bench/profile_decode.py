"""Where a decode step's GPU time goes: torch.profiler over eager decode steps of the engine.

Eager (no CUDA graph) so the profiler sees every kernel; the kernels are the ones the graphs
replay. Prints the top kernels by GPU time per step and the number of kernels per step.

    python bench/profile_decode.py MODEL.gguf --batch 1 --steps 8
"""
from __future__ import annotations

import argparse

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
    args = parser.parse_args()

    import toolkit  # noqa: PLC0415
    from toolkit.core.engine import benchmark  # noqa: PLC0415

    llm = toolkit.LLM(args.model, device="cuda", max_num_seqs=args.batch, enable_prefix_caching=False,
                      enforce_eager=True, kv_cache_memory="4GiB")
    benchmark.measure(llm, args.batch, 128, 4)                      # warm-up: compile every kernel
    if args.prefill:
        profile_prefill(llm, args)
        return
    prompts = benchmark.random_prompts(args.batch, 128, llm.config.vocab_size, 1)
    params = toolkit.SamplingParams(max_tokens=args.steps + 1, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        llm.add_request(prompt, params)
    llm.step()                                                      # prefill, outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            llm.step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.self_device_time_total for e in events) / args.steps
    kernels = sum(e.count for e in events) / args.steps
    print(f"{args.model} batch {args.batch}: {total_us / 1e3:.2f} ms of GPU kernels per step, {kernels:.0f} kernels/step")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:args.top]:
        print(f"  {e.self_device_time_total / args.steps / 1e3:7.3f} ms  x{e.count / args.steps:5.0f}  {e.key[:110]}")
    if args.sequence:
        print_sequence(prof, args)


def print_sequence(prof, args) -> None:
    """The kernels of the last profiled step in launch order: shows what one layer launches."""
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    per_step = len(kernels) // args.steps
    print(f"launch order, last step ({per_step} kernels), first {args.sequence}:")
    for e in kernels[-per_step:][:args.sequence]:
        print(f"  {e.time_range.elapsed_us():7.1f} us  {e.name[:120]}")


def profile_prefill(llm, args) -> None:
    """Host (cProfile) and device (torch.profiler) time of ``--steps`` prefills of one prompt."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415
    import time  # noqa: PLC0415

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
