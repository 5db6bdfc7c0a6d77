"""GGUF tokenizer build time until the first encode, cold (no cache) and warm (from the on-disk cache).

Each run is a fresh process that has imported torch and toolkit (what a GGUF load has imported
anyway) but not transformers: importing it is part of what a user waits for if the tokenizer
needs it. It opens the file (``open_reader``: parsing the metadata), checks the tokenizer
metadata, calls ``build_tokenizer`` and encodes one sentence; the steps are timed separately.
The CPU time of those steps (``time.process_time``) is printed too: on a shared machine it
moves less with the load than the wall time. Cold runs have the cache off (``TOOLKIT_TOKENIZER_CACHE=off``); warm runs share a temporary
cache that one untimed run filled first (the same folder keeps the reader's string indexes,
string_index.py, so a warm run's open is faster too). Medians of ``--repeats`` runs are printed.

SentencePiece vocabularies (``tokenizer.ggml.model = llama``) are timed with both backends side by
side, alternating: ``sentencepiece`` (the default, spm_tokenizer.py) and ``tokenizers``
(``TOOLKIT_GGUF_SENTENCEPIECE=off``); other vocabularies only ever use ``tokenizers``, so the two
rows then time the same code. ``--backend`` picks one.

``--baseline SRC`` also runs another checkout's ``toolkit`` (a folder holding its ``toolkit/``
package, e.g. from ``git archive main toolkit | tar -x -C /tmp/base``), alternating its runs
with this one's so that a shared machine's load falls on both alike.

    python bench/bench_tokenizer_build.py gemma-3-270m-q4_k_m.gguf --repeats 5
    python bench/bench_tokenizer_build.py model.gguf --repeats 5 --backend tokenizers --baseline /tmp/base
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
from pathlib import Path
import torch, toolkit  # imported before timing: a GGUF load has imported them anyway
from toolkit.plugins.loaders.gguf.metadata import Metadata
from toolkit.plugins.loaders.gguf.reader import open_reader
from toolkit.plugins.loaders.gguf.tokenizer import build_tokenizer
from toolkit.plugins.loaders.gguf.tokenizer_checks import check_tokenizer_metadata
path = Path(sys.argv[1])
c0 = time.process_time()
t0 = time.perf_counter(); reader = open_reader(path)
t1 = time.perf_counter(); metadata = Metadata(reader.fields, file=str(path)); check_tokenizer_metadata(metadata)
t2 = time.perf_counter(); c2 = time.process_time(); tokenizer = build_tokenizer(metadata)
t3 = time.perf_counter(); ids = tokenizer.encode("The quick brown fox jumps over the lazy dog.")
t4 = time.perf_counter(); c4 = time.process_time()
print(json.dumps({"cpu": c4 - c0, "cpu_tokenizer": c4 - c2, "open": t1 - t0, "check": t2 - t1, "build": t3 - t2, "encode": t4 - t3, "vocab": len(tokenizer),
                  "backend": type(tokenizer._backend).__name__, "toolkit": str(Path(toolkit.__file__).parent), "transformers": "transformers" in sys.modules}))
"""
STEPS = ("open", "check", "build", "encode")


BACKENDS = {"sentencepiece": "on", "tokenizers": "off"}  # -> $TOOLKIT_GGUF_SENTENCEPIECE


def run(path: str, cache: str, src: str | None, backend: str = "sentencepiece") -> dict:
    env = dict(os.environ, TOOLKIT_TOKENIZER_CACHE=cache, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               TOOLKIT_GGUF_SENTENCEPIECE=BACKENDS[backend])
    cwd = None
    if src:  # a folder holding another checkout's toolkit/: first on the path, and not the working directory
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (src, env.get("PYTHONPATH"))))
        cwd = tempfile.gettempdir()
    out = subprocess.run([sys.executable, "-c", CHILD, path], env=env, cwd=cwd, check=True, capture_output=True,
                         text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if src and not result["toolkit"].startswith(str(Path(src).resolve())):
        raise SystemExit(f"--baseline {src}: the child imported {result['toolkit']} instead")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", help="a folder holding another checkout's toolkit/ package, run alternately")
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both",
                        help="which backend encodes a SentencePiece vocabulary (default: both, alternately)")
    args = parser.parse_args()
    path = os.path.abspath(args.gguf)
    backends = list(BACKENDS) if args.backend == "both" else [args.backend]
    variants = {backend if len(backends) > 1 else "this": (None, backend) for backend in backends}
    if args.baseline:  # another checkout: its own default backend
        variants["baseline"] = (os.path.abspath(args.baseline), "sentencepiece")
    with tempfile.TemporaryDirectory(prefix="tokcache-") as root:
        caches = {name: os.path.join(root, name) for name in variants}
        for name, (src, backend) in variants.items():
            run(path, caches[name], src, backend)  # fills the cache
        for label in ("cold", "warm"):
            runs: dict[str, list[dict]] = {name: [] for name in variants}
            for _ in range(args.repeats):
                for name, (src, backend) in variants.items():
                    runs[name].append(run(path, "off" if label == "cold" else caches[name], src, backend))
            for name, rows in runs.items():
                med = {k: statistics.median(r[k] for r in rows) for k in STEPS}
                until = statistics.median(sum(r[k] for k in STEPS) for r in rows)
                cpu = statistics.median(r["cpu"] for r in rows)
                cpu_tok = statistics.median(r["cpu_tokenizer"] for r in rows)
                print(f"{label:4} {name:13}: open {med['open']:.2f} s  check {med['check']:.2f} s  "
                      f"build_tokenizer {med['build']:.2f} s  first encode {med['encode']:.3f} s  "
                      f"(until the first encode {until:.2f} s, CPU {cpu:.2f} s, of which build + encode {cpu_tok:.2f} s; median of {args.repeats}; vocab {rows[0]['vocab']}; backend {rows[0]['backend']}; "
                      f"transformers imported: {rows[0]['transformers']})", flush=True)


if __name__ == "__main__":
    main()
