"""Does a prefill right after an idle gap run slower than the next one? (issue 13)

    python bench/bench_cpu_prefill_gap.py --llama-bin DIR [--model FILE] [--threads 2] [--reps 8]

Each rep, twice: a llama-bench child (``-p 128 -n 0``), or ``time.sleep`` for a few seconds, then
two 128-token prefills (``generate(prompt, max_new_tokens=1)``) back to back. Prints wall tok/s
and CPU milliseconds (all of this process's threads) of the first and the second prefill, and the
thread count torch had, so a slower first prefill can be told apart from a thread-count change
(same count), from waiting (same CPU time, more wall time) and from a colder machine (more CPU time).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

PROMPT = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-bin", type=Path, required=True)
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=3.0)
    args = parser.parse_args()

    import toolkit  # first: it sets OMP_WAIT_POLICY=PASSIVE only if torch has not loaded yet
    import torch
    from toolkit.core import threads
    from toolkit.plugins.loaders.gguf.loader import demo_model_path

    torch.set_num_threads(args.threads)
    threads.enable(False)
    model = args.model or str(demo_model_path())
    loaded = toolkit.load(model, device="cpu")
    vocab = loaded.config.vocab_size
    ids = torch.randint(10, vocab - 10, (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()

    def prefill() -> tuple[float, float, int]:
        start, cpu = time.perf_counter(), time.process_time()
        loaded.generate(ids, max_new_tokens=1, stop_token_ids=())
        return PROMPT / (time.perf_counter() - start), (time.process_time() - cpu) * 1e3, torch.get_num_threads()

    env = {**os.environ, "LD_LIBRARY_PATH": str(args.llama_bin)}
    prefill(), prefill()
    results: dict[str, list[tuple[float, float, int]]] = {}
    for rep in range(args.reps):
        for gap in ("llama-bench", "sleep"):
            if gap == "llama-bench":
                subprocess.run([str(args.llama_bin / "llama-bench"), "-m", model, "-p", str(PROMPT), "-n", "0",
                                "-t", str(args.threads), "-r", "1"], capture_output=True, check=True, env=env)
            else:
                time.sleep(args.sleep)
            first, second = prefill(), prefill()
            results.setdefault(f"{gap}, first", []).append(first)
            results.setdefault(f"{gap}, second", []).append(second)
            print(f"rep {rep + 1} after {gap}: first {first[0]:.0f} tok/s {first[1]:.0f} ms CPU {first[2]} threads | "
                  f"second {second[0]:.0f} tok/s {second[1]:.0f} ms CPU {second[2]} threads | "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
    print("\n| after | prefill | tok/s median | CPU ms median | threads |\n|---|---|---|---|---|")
    for key, rows in results.items():
        gap, which = key.split(", ")
        print(f"| {gap} | {which} | {statistics.median(r[0] for r in rows):.0f} | "
              f"{statistics.median(r[1] for r in rows):.0f} | {sorted({r[2] for r in rows})} |")


if __name__ == "__main__":
    main()
