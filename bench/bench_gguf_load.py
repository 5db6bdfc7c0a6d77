"""Load the same GGUF with toolkit and with transformers: wall time and peak RSS, as ratios.

    python bench/bench_gguf_load.py                   # the embedded Gemma 3 270M Q4_K_M file
    python bench/bench_gguf_load.py model.gguf --repeat 3

Every measurement runs in a fresh subprocess, so imports, caches and RSS start clean; times
exclude importing torch/transformers/toolkit (the same for both) and peak RSS is the process
high-water mark (``ru_maxrss``), reported also above the post-import baseline. Rows:

* ``model + tokenizer``: ``toolkit.load(path)`` (weights packed, tokenizer built) vs
  transformers ``AutoModelForCausalLM`` + ``AutoTokenizer`` ``from_pretrained(dir, gguf_file=...)``.
* ``tokenizer only``: toolkit's tokenizer from GGUF metadata vs transformers' from the same file.

Ratios are transformers / toolkit (> 1: toolkit is faster or smaller). CPU, fp32 activations.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKER = r"""
import json, os, resource, sys, time
kind, path = sys.argv[1], sys.argv[2]
import torch, transformers, toolkit  # imports are not timed
from toolkit.core.registry import default_registry
from toolkit.plugins.loaders.gguf.checkpoint import GGUFCheckpoint
default_registry()
folder, name = os.path.split(path)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
device_bytes = 0
if kind == "toolkit":
    loaded = toolkit.load(path, device="cpu")
    device_bytes = loaded.report.parameter_bytes
elif kind == "transformers":
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    device_bytes = sum(p.nbytes for p in model.parameters()) + sum(b.nbytes for b in model.buffers())
elif kind == "toolkit-tokenizer":
    GGUFCheckpoint([__import__("pathlib").Path(path)]).tokenizer()
elif kind == "transformers-tokenizer":
    transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "peak_mib": peak / 1024, "above_base_mib": (peak - base) / 1024,
                  "device_mib": device_bytes / 2**20}))
"""


def measure(kind: str, path: str) -> dict:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", TQDM_DISABLE="1")
    done = subprocess.run([sys.executable, "-c", WORKER, kind, path], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{kind} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def best(kind: str, path: str, repeat: int) -> dict:
    runs = [measure(kind, path) for _ in range(repeat)]
    return min(runs, key=lambda run: run["seconds"])


def default_path() -> str:
    from toolkit.plugins.loaders.gguf import GGUFLoader

    return GGUFLoader().default_model()


def row(label: str, ours: dict, theirs: dict) -> None:
    print(f"\n{label}")
    print(f"  {'':14}{'toolkit':>12}{'transformers':>14}{'ratio':>9}")
    for key, unit in (("seconds", "s"), ("peak_mib", "MiB"), ("above_base_mib", "MiB"), ("device_mib", "MiB")):
        if ours[key] or theirs[key]:
            ratio = theirs[key] / ours[key] if ours[key] else float("inf")
            print(f"  {key:14}{ours[key]:>10.2f}{unit:>2}{theirs[key]:>12.2f}{unit:>2}{ratio:>8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", help="GGUF file (default: the embedded Gemma 3 270M Q4_K_M)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement; the fastest is kept")
    args = parser.parse_args()
    path = os.path.abspath(args.path or default_path())
    print(f"file {path} ({os.path.getsize(path) / 2**20:.1f} MiB), {os.cpu_count()} CPUs, repeat {args.repeat}")
    row("model + tokenizer", best("toolkit", path, args.repeat), best("transformers", path, args.repeat))
    row("tokenizer only", best("toolkit-tokenizer", path, args.repeat),
        best("transformers-tokenizer", path, args.repeat))


if __name__ == "__main__":
    main()
