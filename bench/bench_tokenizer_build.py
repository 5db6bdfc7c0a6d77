"""GGUF tokenizer build time, cold (no cache) and warm (from the on-disk cache), each in a fresh process.

Each run opens the file (``open_reader``: parsing the metadata), checks the tokenizer metadata
and calls ``build_tokenizer``; the three steps are timed separately. Cold runs have the cache
off (``TOOLKIT_TOKENIZER_CACHE=off``); warm runs share a temporary cache that one untimed run
filled first. Medians of ``--repeats`` runs are printed.

    python bench/bench_tokenizer_build.py gemma-3-270m-q4_k_m.gguf --repeats 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
from pathlib import Path
from toolkit.plugins.loaders.gguf.metadata import Metadata
from toolkit.plugins.loaders.gguf.reader import open_reader
from toolkit.plugins.loaders.gguf.tokenizer import build_tokenizer
from toolkit.plugins.loaders.gguf.tokenizer_checks import check_tokenizer_metadata
import transformers  # imported before timing: its import is not the tokenizer's cost
path = Path(sys.argv[1])
t0 = time.perf_counter(); reader = open_reader(path)
t1 = time.perf_counter(); metadata = Metadata(reader.fields, file=str(path)); check_tokenizer_metadata(metadata)
t2 = time.perf_counter(); tokenizer = build_tokenizer(metadata)
t3 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "check": t2 - t1, "build": t3 - t2, "vocab": len(tokenizer)}))
"""


def run(path: str, cache: str) -> dict:
    env = dict(os.environ, TOOLKIT_TOKENIZER_CACHE=cache)
    out = subprocess.run([sys.executable, "-c", CHILD, path], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tokcache-") as cache:
        run(args.gguf, cache)  # fills the cache
        for label, where in (("cold", "off"), ("warm", cache)):
            runs = [run(args.gguf, where) for _ in range(args.repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in ("open", "check", "build")}
            print(f"{label}: open {med['open']:.2f} s  check {med['check']:.2f} s  build_tokenizer {med['build']:.2f} s  "
                  f"(total {sum(med.values()):.2f} s; median of {args.repeats}; vocab {runs[0]['vocab']})", flush=True)


if __name__ == "__main__":
    main()
