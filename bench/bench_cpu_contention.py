"""CPU decode speed of the README's main job when another process keeps cores busy, as a ratio.

    python bench/bench_cpu_contention.py                        # the demo GGUF, 32 tokens, 2 runs each
    python bench/bench_cpu_contention.py --busy 1 --tokens 32 --repeat 3

Runs ``toolkit load --format gguf --prompt ... --max-tokens N`` (the README command, as a
subprocess) idle and then with ``--busy`` spinning processes (pure-Python busy loops) started
beside it, interleaved, and prints each run's decode tok/s (parsed from the command's
``completion`` line) and median(busy) / median(idle). With ``--fixed-threads`` the command
runs with ``OMP_NUM_THREADS`` set to the core count, i.e. torch's default without toolkit's
thread fitting, for comparison. Linux; the machine should be otherwise idle.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import statistics
import subprocess
import sys

RATE = re.compile(r"completion\s+(\d+) tokens in ([\d.]+)s")


def spin() -> None:
    while True:
        pass


def decode_rate(tokens: int, fixed_threads: bool) -> float:
    env = dict(os.environ)
    env.pop("TOOLKIT_THREADS", None)
    env.pop("OMP_NUM_THREADS", None)
    if fixed_threads:
        env["OMP_NUM_THREADS"] = str(len(os.sched_getaffinity(0)))
    done = subprocess.run([sys.executable, "-m", "toolkit", "load", "--format", "gguf", "--device", "cpu",
                           "--prompt", "The capital of France is", "--max-tokens", str(tokens)],
                          capture_output=True, text=True, env=env, check=True)
    match = RATE.search(done.stdout)
    return int(match.group(1)) / float(match.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=1, help="busy processes beside the decode")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--fixed-threads", action="store_true", help="torch's default threads, no fitting")
    args = parser.parse_args()
    idle, busy = [], []
    for _ in range(args.repeat):
        idle.append(decode_rate(args.tokens, args.fixed_threads))
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
        for process in spinners:
            process.start()
        try:
            busy.append(decode_rate(args.tokens, args.fixed_threads))
        finally:
            for process in spinners:
                process.terminate()
        print(f"idle {idle[-1]:.2f} tok/s   with {args.busy} busy process(es) {busy[-1]:.2f} tok/s", flush=True)
    print(f"cores {len(os.sched_getaffinity(0))}, threads {'fixed' if args.fixed_threads else 'fitted'}: "
          f"median idle {statistics.median(idle):.2f} tok/s, busy {statistics.median(busy):.2f} tok/s, "
          f"busy/idle {statistics.median(busy) / statistics.median(idle):.2f}")


if __name__ == "__main__":
    main()
