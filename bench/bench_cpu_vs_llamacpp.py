"""CPU GGUF speed against llama.cpp in one run: decode, prefill and (optionally) quantization.

    python bench/bench_cpu_vs_llamacpp.py --llama-bin DIR [--model FILE] [--threads 2] [--rounds 3]
        [--quantize-from F32.gguf --types Q8_0,Q4_K_M,Q6_K [--quantize-only]] [--no-kernels]

``DIR`` holds a CPU build of llama.cpp (``llama-bench``, ``llama-quantize``). The model defaults to
the embedded demo (Gemma 3 270M Q4_K_M). Each round runs llama.cpp, then toolkit, on the same
file and thread count, so contention on a shared machine hits both alike; the table gives the
best and the median of the rounds and the ratio toolkit / llama.cpp (targets from issue 13:
decode >= 0.5, prefill >= 1, quantization time <= 1x llama-quantize's).

* prefill: llama-bench ``-p 128`` vs ``generate()`` of one token after a 128-token prompt (tokens/s
  of the prompt; like llama-bench, only the last position's logits are computed). llama-bench
  times a prompt run that follows an untimed warm-up run in the same process; toolkit's timed
  prefill likewise follows an untimed one each round (``--no-round-warmup`` times the first one
  after the llama-bench child instead; each round's line prints both);
* decode: llama-bench ``-n 32`` vs ``generate()`` of 32 tokens after a one-token prompt;
* kernels: the CPU ``gguf_matmul`` for one token (a decode GEMV) on one tensor of each
  quantization type in the file, in GB/s of packed weights read, next to the torch
  dequantize-then-matmul path it replaces (``gguf_matmul_chunked``); thread CPU time would hide
  waiting, so this is wall time, median of several calls;
* quantization: ``llama-quantize SRC OUT TYPE THREADS`` vs ``toolkit convert SRC OUT --to gguf:TYPE``
  (seconds, wall clock of each whole process, same threads; ``--rounds`` interleaved pairs per type,
  medians). ``--quantize-only`` skips the model benches.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT, GENERATE = 128, 32


def llama_bench(binary: Path, model: str, threads: int) -> dict[str, float]:
    out = subprocess.run([str(binary / "llama-bench"), "-m", model, "-p", str(PROMPT), "-n", str(GENERATE),
                          "-t", str(threads), "-r", "1", "-o", "json"], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    return {"prefill": next(r["avg_ts"] for r in rows if r["n_prompt"] == PROMPT and r["n_gen"] == 0),
            "decode": next(r["avg_ts"] for r in rows if r["n_gen"] == GENERATE and r["n_prompt"] == 0)}


def toolkit_speed(loaded, vocab: int, warm_up: bool = True) -> dict[str, float]:
    import torch

    ids = torch.randint(10, vocab - 10, (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    first = None
    if warm_up:  # like llama-bench, whose timed prompt run follows an untimed one in the same process
        start = time.perf_counter()
        loaded.generate(ids, max_new_tokens=1, stop_token_ids=())
        first = PROMPT / (time.perf_counter() - start)  # right after the llama-bench child: printed, not scored
    start, cpu = time.perf_counter(), time.process_time()
    loaded.generate(ids, max_new_tokens=1, stop_token_ids=())
    prefill = PROMPT / (time.perf_counter() - start)
    # CPU seconds of all our threads: wall >> cpu / threads means waiting (a core held by another
    # process, a late worker), not slower arithmetic
    prefill_cpu = time.process_time() - cpu
    prefill_threads = torch.get_num_threads()  # the count the prefill ran with (nothing may change it)
    start = time.perf_counter()
    produced = loaded.generate(ids[:1], max_new_tokens=GENERATE, stop_token_ids=())
    decode = len(produced) / (time.perf_counter() - start)
    return {"prefill": prefill, "decode": decode, "prefill_cpu": prefill_cpu, "threads": prefill_threads,
            "first_prefill": first}


def quantize_times(binary: Path, source: str, qtype: str, threads: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(dir=Path(source).parent) as work:
        start = time.perf_counter()
        subprocess.run([str(binary / "llama-quantize"), source, f"{work}/l.gguf", qtype, str(threads)],
                       capture_output=True, check=True)
        theirs = time.perf_counter() - start
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "toolkit", "convert", source, f"{work}/t.gguf", "--to", f"gguf:{qtype}"],
                       capture_output=True, check=True, env=env)
        ours = time.perf_counter() - start
    return ours, theirs


def kernel_speeds(model: str, repeats: int = 7) -> list[tuple[str, str, float, float]]:
    """(type, tensor, compiled GB/s, torch-path GB/s) for the first tensor of each quantized type."""
    import numpy as np
    import torch
    from gguf import GGUFReader

    from toolkit.kernels import runtime
    from toolkit.kernels.gguf.cpu import gguf_matmul_chunked

    def wall(fn, repeats: int = repeats) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    found = {}
    for tensor in GGUFReader(model).tensors:
        if tensor.tensor_type.name not in found and len(tensor.shape) == 2 and tensor.tensor_type.name not in (
                "F32", "F16", "BF16"):
            found[tensor.tensor_type.name] = tensor
    rows_out = []
    for name, tensor in sorted(found.items()):
        data = torch.from_numpy(np.ascontiguousarray(tensor.data).view(np.uint8).reshape(int(tensor.shape[1]), -1))
        cols, qtype = int(tensor.shape[0]), int(tensor.tensor_type)
        x = torch.randn(1, cols)
        fast = runtime.resolve("gguf_matmul", x, data, qtype, cols)
        ours = wall(lambda: fast(x, data, qtype, cols))
        torch_path = wall(lambda: gguf_matmul_chunked(x, data, qtype, cols), repeats=3)
        rows_out.append((name, f"{tensor.name} {tuple(data.shape[:1])[0]}x{cols} ({fast.__name__})",
                         data.numel() / ours / 1e9, data.numel() / torch_path / 1e9))
    return rows_out


def machine() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    return f"{model}, {os.cpu_count()} cores visible, load average {os.getloadavg()[0]:.1f} at start"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-bin", type=Path, required=True)
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quantize-from")
    parser.add_argument("--types", default="Q8_0,Q4_K_M,Q6_K")
    parser.add_argument("--no-kernels", action="store_true", help="skip the per-type kernel table")
    parser.add_argument("--quantize-only", action="store_true", help="only the quantization table")
    parser.add_argument("--no-round-warmup", action="store_true",
                        help="time toolkit's first prefill after each llama-bench child (no untimed one first)")
    args = parser.parse_args()
    if args.quantize_only:
        print(f"machine: {machine()}\nthreads: {args.threads}, rounds: {args.rounds}", flush=True)
        return quantize_table(args)

    import toolkit  # first: it sets OMP_WAIT_POLICY=PASSIVE only if torch has not loaded yet
    import torch
    from toolkit.plugins.loaders.gguf.loader import demo_model_path

    from toolkit.core import threads

    torch.set_num_threads(args.threads)
    # --threads pins the count: the free-core fitting (toolkit/core/threads.py) is for the command
    # line and opt-in library callers; a bench comparing fixed thread counts must not use it
    threads.enable(False)
    model = args.model or str(demo_model_path())
    print(f"machine: {machine()}\nmodel: {model}\nthreads: {args.threads}, rounds: {args.rounds}", flush=True)
    loaded = toolkit.load(model, device="cpu")
    vocab = loaded.config.vocab_size
    theirs: dict[str, list[float]] = {"prefill": [], "decode": []}
    ours: dict[str, list[float]] = {"prefill": [], "decode": []}
    firsts: list[float] = []
    toolkit_speed(loaded, vocab, warm_up=False)  # warm-up (first-call allocations, kernel selection)
    for round_ in range(args.rounds):
        for key, value in llama_bench(args.llama_bin, model, args.threads).items():
            theirs[key].append(value)
        speed = toolkit_speed(loaded, vocab, warm_up=not args.no_round_warmup)
        for key in ours:
            ours[key].append(speed[key])
        first = ""
        if speed["first_prefill"]:
            firsts.append(speed["first_prefill"])
            first = f", untimed first prefill {speed['first_prefill']:.1f} tok/s"
        print(f"round {round_ + 1}: llama.cpp {theirs['decode'][-1]:.1f} / {theirs['prefill'][-1]:.1f}, toolkit "
              f"{ours['decode'][-1]:.2f} / {ours['prefill'][-1]:.1f} tok/s (decode / prefill; prefill on "
              f"{speed['threads']} threads, {speed['prefill_cpu'] * 1e3:.0f} ms CPU{first}), "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\n| phase | llama.cpp tok/s best / median | toolkit tok/s best / median | ratio (median) |")
    print("|---|---|---|---|")
    for key in ("decode", "prefill"):
        t, o = theirs[key], ours[key]
        print(f"| {key} | {max(t):.1f} / {statistics.median(t):.1f} | {max(o):.1f} / {statistics.median(o):.1f} | "
              f"{statistics.median(o) / statistics.median(t):.3f} |")
    if firsts:  # shown, not scored: what the interleaving costs the first prefill after a child
        t = theirs["prefill"]
        print(f"| prefill, toolkit's first after the child | {max(t):.1f} / {statistics.median(t):.1f} | "
              f"{max(firsts):.1f} / {statistics.median(firsts):.1f} | {statistics.median(firsts) / statistics.median(t):.3f} |")
    if not args.no_kernels:
        print(f"\n| type | tensor (op) | compiled GB/s | torch path GB/s | speed-up |\n|---|---|---|---|---|")
        for name, label, ours_gbs, torch_gbs in kernel_speeds(model):
            print(f"| {name} | {label} | {ours_gbs:.2f} | {torch_gbs:.3f} | {ours_gbs / torch_gbs:.1f}x |")
    if args.quantize_from:
        quantize_table(args)


def quantize_table(args) -> None:
    """Per type, ``--rounds`` interleaved runs of both; medians of each whole process's wall time."""
    print(f"\n| type | llama-quantize s (median) | toolkit convert s (median) | ratio | rounds (llama / toolkit) |"
          f"\n|---|---|---|---|---|")
    for qtype in args.types.split(","):
        runs = [quantize_times(args.llama_bin, args.quantize_from, qtype, args.threads) for _ in range(args.rounds)]
        ours, theirs = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        pairs = ", ".join(f"{t:.2f}/{o:.2f}" for o, t in runs)
        print(f"| {qtype} | {theirs:.2f} | {ours:.2f} | {ours / theirs:.2f} | {pairs} |", flush=True)


if __name__ == "__main__":
    main()
