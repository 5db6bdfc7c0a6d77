"""Where ``toolkit.load`` spends its time in a fresh process: phases, imports, garbage collection.

    python bench/bench_load_phases.py model.gguf                        # cuda if available, 5 runs
    python bench/bench_load_phases.py model.gguf --device cpu --repeat 7
    python bench/bench_load_phases.py model.gguf --json out.json --profile 40   # + a cProfile of one load
    python bench/bench_load_phases.py model.gguf --first-token   # + one greedy token, as llama-bench's load time

Each run is a new interpreter that imports torch (and, on CUDA, initialises the device: a user
has both before loading, and llama.cpp's load time excludes them too), then times
``import toolkit`` and ``toolkit.load(path, device=...)`` separately. Per run it records the
load report's phases (``plugins``: discovering and importing plugins, then ``resolve``,
``open``, ``build``, ``load_weights``, ``finish``, ``tokenizer``), ``other`` (the load's wall
time minus those phases), the garbage collector's pauses inside the load (through
``gc.callbacks``), how many modules the load imported for the first time, and which packages of
``WATCH`` among them (a GGUF load needs ``gguf``, ``numpy`` and ``tokenizers``; gguf-py's
``__init__`` brings ``yaml`` and ``sentencepiece``; ``triton``, ``transformers``, ``jinja2``,
``safetensors`` it should not import). Printed: the median of each over the runs, and
``load_s`` per run with its minimum and the process's CPU time (steadier than wall time on a
shared machine), and how long after the load returned its background release finished (the
checkpoint closed and its files unmapped: ``core/release.py``).

``--first-token`` also times one greedy token after the load and prints ``llama.cpp's span``: from
the start of the ``build`` phase to the end of that token. llama.cpp's own "load time" starts after
its loader has parsed the file's metadata and tensor table (``t_start_us`` is taken after
``llama_model_loader``'s constructor, and its backends were registered before: our ``plugins`` and
``open``) and ends with its first evaluation, so this is the same stretch of work on our side. That
evaluation is llama-bench's warm-up of one generated token: one token (the vocabulary's BOS) decoded
in an empty context (``test_gen(ctx, 1, ...)`` in tools/llama-bench/llama-bench.cpp); ours is the
same one-token prompt (BOS, else the first token ``encode("Hello")`` gives) and its greedy pick. On
CUDA the token's first kernel call imports Triton (a GGUF load does not): that import is timed on its
own, just before the token, and reported as part of it.

This is a profile, not a ratio against a peer: bench/bench_vs_llamacpp.py puts ``toolkit.load``
beside llama.cpp's load time. Run it on a quiet machine; name the machine with the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# Packages a GGUF load needs none of; each is reported if the load imported it.
WATCH = ("triton", "transformers", "jinja2", "safetensors", "bitsandbytes", "typer", "pydantic", "yaml",
         "sentencepiece", "tokenizers", "gguf", "numpy", "scipy", "sympy")

WORKER = r"""
import gc, json, sys, time
path, device, watch = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
import torch
if device.startswith("cuda"):
    torch.empty(1, device=device)  # CUDA's own start-up is not loading
start = time.perf_counter()
import toolkit
import_s = time.perf_counter() - start
pauses = []
def on_gc(phase, info, _t=[0.0]):
    if phase == "start":
        _t[0] = time.perf_counter()
    else:
        pauses.append((info["generation"], time.perf_counter() - _t[0]))
before = set(sys.modules)
profile_top, first_token = int(sys.argv[4]), sys.argv[5] == "1"
if profile_top:
    import cProfile, pstats
    profiler = cProfile.Profile()
    profiler.enable()
gc.callbacks.append(on_gc)
start, cpu_start = time.perf_counter(), time.process_time()
loaded = toolkit.load(path, device=device)
if device.startswith("cuda"):
    torch.cuda.synchronize()
load_end = time.perf_counter()
load_s, load_cpu_s = load_end - start, time.process_time() - cpu_start
gc.callbacks.remove(on_gc)
import importlib.util, threading
released_at = []  # when the checkpoint's background release (the file's unmapping) finished
def watch_release():
    if importlib.util.find_spec("toolkit.core.release") is not None:  # absent in code before it (A/B runs)
        from toolkit.core import release
        release.wait()
    released_at.append(time.perf_counter())
watcher = threading.Thread(target=watch_release)
watcher.start()
if profile_top:
    profiler.disable()
    for order in ("cumulative", "tottime"):
        pstats.Stats(profiler, stream=sys.stderr).sort_stats(order).print_stats(profile_top)
new = set(sys.modules) - before
phases = dict(loaded.report.phases)
first_s = first_heavy = llama_span_s = triton_s = first_error = None
def one_token():  # (seconds for one greedy token, of which importing Triton: None where not imported here)
    start, imported = time.perf_counter(), None
    if device.startswith("cuda") and "triton" not in sys.modules:  # the first kernel call would import it
        import triton
        imported = time.perf_counter() - start
    bos = loaded.config.bos_token_id
    loaded.generate([bos] if bos is not None else loaded.tokenizer.encode("Hello")[:1], max_new_tokens=1)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, imported
if first_token:  # what llama-bench's "load time" also covers: the first evaluation
    before_first = set(sys.modules)
    try:  # a failing token is reported, and the load's figures still come back
        first_s, triton_s = one_token()
    except Exception as exc:
        first_error = f"{type(exc).__name__}: {exc}"[:500]
    first_heavy = sorted(w for w in watch if w in set(sys.modules) - before_first)
    build_start = getattr(loaded.report, "phase_starts", {}).get("build")  # absent in code before it (A/B runs)
    if build_start is not None and first_s is not None:  # llama.cpp's span: its hparams (our build) to its first eval
        llama_span_s = load_end - build_start + first_s
watcher.join()
print(json.dumps({"import_toolkit_s": import_s, "load_s": load_s, "load_cpu_s": load_cpu_s, "phases": phases,
                  "released_after_s": released_at[0] - load_end,
                  "other_s": load_s - sum(phases.values()),
                  "gc_s": sum(s for _, s in pauses), "gc_full": sum(1 for g, _ in pauses if g == 2),
                  "modules_imported": len(new),
                  "heavy_imported": sorted(w for w in watch if w in new),
                  "first_token_s": first_s, "first_token_imported": first_heavy, "llama_span_s": llama_span_s,
                  "first_token_triton_s": triton_s,
                  "first_token_error": first_error}))
"""


def run_once(path: str, device: str, profile_top: int = 0, first_token: bool = False) -> dict:
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", TQDM_DISABLE="1")
    done = subprocess.run([sys.executable, "-c", WORKER, path, device, ",".join(WATCH), str(profile_top),
                           "1" if first_token else "0"],
                          capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"worker failed:\n{done.stderr[-3000:]}")
    if profile_top:
        print(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> dict:
    def med(values):
        return statistics.median(values)

    phase_names = list(dict.fromkeys(name for run in runs for name in run["phases"]))
    return {"runs": len(runs),
            "import_toolkit_s": med([r["import_toolkit_s"] for r in runs]),
            "load_s": med([r["load_s"] for r in runs]),
            "load_s_each": [round(r["load_s"], 3) for r in runs],
            "load_s_min": min(r["load_s"] for r in runs),
            "load_cpu_s": med([r["load_cpu_s"] for r in runs]),
            "phases": {name: med([r["phases"].get(name, 0.0) for r in runs]) for name in phase_names},
            "other_s": med([r["other_s"] for r in runs]),
            "released_after_s": med([r.get("released_after_s", 0.0) for r in runs]),
            "gc_s": med([r["gc_s"] for r in runs]),
            "gc_full": med([r["gc_full"] for r in runs]),
            "modules_imported": med([r["modules_imported"] for r in runs]),
            "heavy_imported": sorted({name for r in runs for name in r["heavy_imported"]}),
            "first_token_s": _median_of_present([r["first_token_s"] for r in runs]),
            "first_token_errors": sorted({r["first_token_error"] for r in runs if r.get("first_token_error")}),
            "first_token_imported": sorted({name for r in runs for name in r["first_token_imported"] or ()}),
            "llama_span_s": _median_of_present([r.get("llama_span_s") for r in runs]),
            "first_token_triton_s": _median_of_present([r.get("first_token_triton_s") for r in runs])}


def _median_of_present(values: list) -> float | None:
    """The median of the values that are not None (None when none is)."""
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="also write the summary and every run here")
    parser.add_argument("--first-token", action="store_true",
                        help="also time one greedy token after the load (llama-bench's load time includes the "
                             "first evaluation), and what it imported")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="one more fresh process with the load under cProfile: print its N costliest "
                             "functions by cumulative and by own time (not counted in the medians)")
    args = parser.parse_args()
    device = args.device
    if device is None:
        import torch  # noqa: PLC0415

        device = "cuda" if torch.cuda.is_available() else "cpu"
    runs = [run_once(args.path, device, first_token=args.first_token) for _ in range(args.repeat)]
    summary = summarize(runs)
    print(f"toolkit.load({args.path!r}, device={device!r}): median of {len(runs)} fresh processes")
    print(f"  import toolkit   {summary['import_toolkit_s']:.3f} s (not part of the load)")
    print(f"  toolkit.load     {summary['load_s']:.3f} s   (min {summary['load_s_min']:.3f} s; each: "
          f"{summary['load_s_each']}; CPU time of the process {summary['load_cpu_s']:.3f} s)")
    for name, seconds in summary["phases"].items():
        print(f"    {name:<14} {seconds:.3f} s")
    print(f"    {'other':<14} {summary['other_s']:.3f} s   (load minus the phases)")
    print(f"  released         {summary['released_after_s']:.3f} s after the load returned (the checkpoint closed "
          f"and its files unmapped in the background: core/release.py)")
    print(f"  gc pauses        {summary['gc_s']:.3f} s, {summary['gc_full']:g} full collection(s), "
          f"anywhere in the load")
    print(f"  modules imported by the load: {summary['modules_imported']:g}; of the watched packages: "
          f"{', '.join(summary['heavy_imported']) or 'none'}")
    if summary["first_token_s"] is not None:
        print(f"  first token      {summary['first_token_s']:.3f} s after the load (imported: "
              f"{', '.join(summary['first_token_imported']) or 'none of the watched packages'})")
    if summary["first_token_triton_s"] is not None:
        print(f"    of which       {summary['first_token_triton_s']:.3f} s importing Triton (the first kernel call's "
              f"import, timed on its own)")
    for error in summary["first_token_errors"]:
        print(f"  first token failed: {error}")
    if summary["llama_span_s"] is not None:
        print(f"  llama.cpp's span {summary['llama_span_s']:.3f} s (from the build phase's start to the end of the "
              f"first token: what llama.cpp's 'load time' covers, docs/benchmarks.md)")
    if args.profile:
        print("\ncProfile of one more load (slower than unprofiled; for where, not how long):")
        run_once(args.path, device, args.profile)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"path": args.path, "device": device, "summary": summary, "runs": runs}, handle, indent=1)


if __name__ == "__main__":
    main()
