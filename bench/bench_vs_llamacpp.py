"""toolkit's engine against llama.cpp on the same GGUF files, side by side in one run.

For each GGUF file:

* llama.cpp: ``llama-bench -fa 1 -p 512 -n 128 -ngl 99 -o json`` (prompt 512 tok/s, generation
  tok/s at batch 1) and ``llama-batched-bench -npp 128 -ntg 128 -npl 1,8,32,64 -fa on -ngl 99
  --output-format jsonl`` (``S_TG``, generation tok/s over the whole batch);
* toolkit, in a fresh process per file (so neither engine holds GPU memory the other needs):
  the engine's own benchmark (``toolkit bench``'s ``--batch-sizes 1,8,32,64 --input-len 128
  --output-len 128``, each size after an untimed warm-up batch of its own: ``warmup_each``), decode
  tok/s = batch / median TPOT; prefill = 512 / median TTFT of a single 512-token prompt (5 runs after a
  warm-up).

Writes one markdown table of ratios (toolkit / llama.cpp; > 1 means toolkit is faster) and a
JSON file with every raw number. llama.cpp's batch-1 figure is the larger of llama-bench's
``tg128`` and batched-bench's ``B=1`` row, so the ratio never flatters toolkit. Load: each engine's load alone in
``--load-runs`` fresh processes (default 5; toolkit: ``bench_load_phases``' worker, llama.cpp: a one-token
``llama-bench -v``), one of each in turn after both engines' speed runs, the medians side by side (toolkit's single
loads varied by up to 60% between processes on one H100 host, llama.cpp's by a few percent:
``interleaved_load_times``). The two load times cover different work: llama.cpp's starts after its loader
has parsed the file and its backends were registered, and ends with its first evaluation; ``toolkit.load``
includes plugin discovery and the file's parse, and no evaluation. So each toolkit load is followed by one
greedy token, and a second cell compares llama.cpp's load time with toolkit's ``build`` phase through that
token (``bench_load_phases --first-token``: the same stretch of work; docs/benchmarks.md).

    python bench/bench_vs_llamacpp.py --llama-build /tmp/llama.cpp/build --out /tmp/vs --models a.gguf b.gguf
    python bench/bench_vs_llamacpp.py --skip-llamacpp --models a.gguf      # toolkit only
    python bench/bench_vs_llamacpp.py --llama-build B --loads-only --load-runs 12 --models a.gguf  # loads alone
    python bench/bench_vs_llamacpp.py --extra-model x.safetensors-dir ...   # toolkit only, for reference rows

How to build llama.cpp on the device: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

BATCHES = (1, 8, 32, 64)


# ---- llama.cpp ----------------------------------------------------------------------------------
def _binary(build: Path, name: str) -> Path:
    for candidate in (build / "bin" / name, build / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{name} not found under {build} (build it: docs/benchmarks.md)")


def _load_time(stderr: str) -> dict:
    """llama_perf_context_print's first "load time": from the start of the model load to the end of
    the first evaluation (weights, vocabulary, context, and that first batch: llama.cpp's own
    definition, so it slightly overstates the load), or, if the log has none, its lines that
    mention loading (to see why)."""
    load = re.search(r"load time\s*=\s*([0-9.]+) ms", stderr)
    if load:
        return {"load_s": float(load.group(1)) / 1e3}
    return {"load_lines": [line for line in stderr.splitlines() if "load" in line.lower()][-8:]}


def _llama_bench_command(build: Path, model: str, prompt: int, gen: int, *repeats: str) -> list[str]:
    """``llama-bench`` on ``model`` (flash attention, every layer on the GPU, JSON out), ``repeats``: ``-r N`` or
    nothing (its default); ``-v``: its log (with the load time) goes to stderr."""
    return [str(_binary(build, "llama-bench")), "-m", model, "-fa", "1", "-p", str(prompt), "-n", str(gen), *repeats,
            "-ngl", "99", "-o", "json", "-v"]


def llama_bench(build: Path, model: str, prompt: int, gen: int) -> dict:
    cmd = _llama_bench_command(build, model, prompt, gen)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = proc.stdout
    rows = json.loads(out[out.index("["):out.rindex("]") + 1])      # the JSON array, whatever surrounds it
    result = {"command": " ".join(cmd)}
    result.update(_load_time(proc.stderr))
    for row in rows:
        if row["n_prompt"] and not row["n_gen"]:
            result["prefill_tok_s"] = row["avg_ts"]
        elif row["n_gen"] and not row["n_prompt"]:
            result["decode_b1_tok_s"] = row["avg_ts"]
    return result


def llama_load_time(build: Path, model: str) -> float | None:
    """llama.cpp's load time (``_load_time``: llama-bench's ``-v`` log; batched-bench prints none) in a fresh process
    of ``llama-bench`` doing the least it can (one generated token, once), None where its log has none: the peer of
    ``toolkit_load_time``."""
    cmd = _llama_bench_command(build, model, 0, 1, "-r", "1")
    return _load_time(subprocess.run(cmd, capture_output=True, text=True, check=True).stderr).get("load_s")


def llama_batched_bench(build: Path, model: str, batches, input_len: int, output_len: int) -> dict:
    ctx = max(batches) * (input_len + output_len + 256)   # every sequence's own KV stream, with room
    cmd = [str(_binary(build, "llama-batched-bench")), "-m", model, "-c", str(ctx), "-b", "2048", "-ub", "512",
           "-npp", str(input_len), "-ntg", str(output_len), "-npl", ",".join(map(str, batches)), "-fa", "on",
           "-ngl", "99", "--output-format", "jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result = {"command": " ".join(cmd), "decode_tok_s": {}}
    result.update(_load_time(proc.stderr))
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            result["decode_tok_s"][int(row["pl"])] = row["speed_tg"]
    return result


# ---- toolkit ------------------------------------------------------------------------------------
def toolkit_worker(model: str, batches, input_len: int, output_len: int, prompt: int, out: str,
                   device: str = "cuda") -> None:
    """Runs in its own process: load once, decode at each batch size, then time prefill."""
    import torch  # noqa: PLC0415

    import toolkit  # noqa: PLC0415
    from toolkit.core.engine import benchmark  # noqa: PLC0415

    if device == "cuda":  # CUDA's own start-up is not loading (llama.cpp's load time excludes it too)
        torch.empty(1, device="cuda")
    start = time.perf_counter()
    loaded = toolkit.load(model, device=device)     # weights and tokenizer: what llama.cpp's load time covers
    load_s = time.perf_counter() - start
    llm = toolkit.LLM(loaded, max_num_seqs=max(batches), enable_prefix_caching=False)
    engine_s = time.perf_counter() - start - load_s  # KV cache and decode-graph capture
    # a warm-up batch at each size first (untimed), as llama-bench warms up each test: decode speed is the
    # steady state, not the first run's once-per-shape graph captures (docs/benchmarks.md, run 11)
    rows = benchmark.run(llm, list(batches), input_len, output_len, warmup_each=True)
    decode = {row["batch_size"]: row["batch_size"] * 1e3 / row["tpot_p50_ms"] for row in rows}
    benchmark.measure(llm, 1, prompt, 2, seed=99)                     # warm-up at the prefill shape
    ttft = [benchmark.measure(llm, 1, prompt, 1, seed=100 + i)["ttft_p50_ms"] for i in range(5)]
    result = {"load_s": load_s, "engine_setup_s": engine_s, "decode_tok_s": decode, "rows": rows, "prefill_ttft_ms": ttft,
              "prefill_tok_s": prompt * 1e3 / statistics.median(ttft),
              "device": torch.cuda.get_device_name() if device == "cuda" else device,
              "cuda_graphs": llm.executor.runner.graphs is not None,
              "graph_note": getattr(llm.executor.runner, "graph_note", None)}
    Path(out).write_text(json.dumps(result, indent=2))


def run_toolkit(model: str, args, scratch: Path) -> dict:
    out = scratch / (Path(model).name + ".toolkit.json")
    cmd = [sys.executable, __file__, "--worker", model, "--out", str(scratch),
           "--batch-sizes", ",".join(map(str, args.batches)), "--input-len", str(args.input_len),
           "--output-len", str(args.output_len), "--prompt", str(args.prompt), "--worker-json", str(out),
           "--device", args.device]
    proc = subprocess.run(cmd, text=True, capture_output=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode:
        return {"error": (proc.stdout + proc.stderr)[-3000:]}
    result = json.loads(out.read_text())
    result["decode_tok_s"] = {int(k): v for k, v in result["decode_tok_s"].items()}
    return result


def toolkit_load_time(model: str, device: str) -> dict:
    """``toolkit.load`` (weights and tokenizer) in a fresh process, after ``import torch`` and the device's own
    start-up (``bench_load_phases``' worker), then one greedy token: ``load_s``, and ``span_s``, the stretch
    llama.cpp's load time covers (from the ``build`` phase's start to the end of that token; docs/benchmarks.md)."""
    from bench_load_phases import run_once  # noqa: PLC0415 - a sibling script of bench/

    run = run_once(model, device, first_token=True)
    return {"load_s": run["load_s"], "span_s": run.get("llama_span_s")}


def interleaved_load_times(model: str, args, ours: bool, theirs: bool) -> dict[str, list[float]]:
    """``args.load_runs`` fresh-process loads of each engine that ran (``ours``: toolkit, ``theirs``: llama.cpp),
    alternating one of each, after flushing dirty pages (``os.sync``: the files may have just been written). Why
    alternate: in blocks of five per engine, toolkit's median moved 0.28-0.63 s between runs on one H100 host while
    llama.cpp's stayed within 0.29-0.36 (runs 33-34, docs/benchmarks.md), so whichever block ran in a busier moment
    lost; alternating, both engines sample the same moments. Returns ``toolkit`` (``toolkit.load``'s times),
    ``toolkit_span`` (llama.cpp's span on toolkit's side, where the code reports it) and ``llamacpp``."""
    os.sync()
    times: dict[str, list[float]] = {"toolkit": [], "toolkit_span": [], "llamacpp": []}
    for _ in range(args.load_runs):
        if ours:
            run = toolkit_load_time(model, args.device)
            times["toolkit"].append(run["load_s"])
            if run["span_s"] is not None:
                times["toolkit_span"].append(run["span_s"])
        if theirs and (seconds := llama_load_time(args.llama_build, model)) is not None:
            times["llamacpp"].append(seconds)
    return times


def _load_cell(ours: dict, theirs: dict) -> str:
    """``llama.cpp / toolkit`` load seconds: the medians of the repeated fresh-process loads where both have them
    (``--load-runs``), else the one load of each engine's benchmark process."""
    if ours.get("load_runs_s") and theirs.get("load_runs_s"):
        return (f"{statistics.median(theirs['load_runs_s']):.2f} / {statistics.median(ours['load_runs_s']):.2f} "
                f"(median of {len(theirs['load_runs_s'])} / {len(ours['load_runs_s'])})")
    mine = f"{ours['load_s']:.2f}" if "load_s" in ours else ("error" if "error" in ours else "-")
    peer = f"{theirs['load_s']:.2f}" if "load_s" in theirs else "-"
    return f"{peer} / {mine}"


def _span_cell(ours: dict, theirs: dict) -> str:
    """``llama.cpp / toolkit`` over the same stretch of work: llama.cpp's load time (its own span) against
    toolkit's build phase through one greedy token, the medians of the repeated loads; ``-`` without both."""
    if not (ours.get("span_runs_s") and theirs.get("load_runs_s")):
        return "-"
    return f"{statistics.median(theirs['load_runs_s']):.2f} / {statistics.median(ours['span_runs_s']):.2f}"


# ---- table ----------------------------------------------------------------------------------------
def _cell(ours, theirs) -> str:
    if ours is None or theirs is None:
        return " / ".join("-" if v is None else f"{v:,.0f}" for v in (theirs, ours))
    return f"{theirs:,.0f} / {ours:,.0f} = **{ours / theirs:.2f}x**"


def table(results: dict, batches) -> str:
    head = ("| model | " + " | ".join(f"decode b{b} tok/s" for b in batches)
            + " | prefill tok/s | load s | load s, llama.cpp's span |")
    lines = ["cells: llama.cpp / toolkit = toolkit's speed over llama.cpp's; load: toolkit.load against llama.cpp's "
             "load time; llama.cpp's span: toolkit's build phase through one greedy token, the work llama.cpp's "
             "load time covers", "", head, "|" + "---|" * (len(batches) + 4)]
    for model, res in results.items():
        ours, theirs = res.get("toolkit", {}), res.get("llamacpp", {})
        cells = []
        for b in batches:
            mine = ours.get("decode_tok_s", {}).get(b)
            peer = theirs.get("decode_tok_s", {}).get(b)
            if b == 1 and theirs.get("decode_b1_tok_s"):
                peer = max(peer or 0, theirs["decode_b1_tok_s"])
            cells.append(_cell(mine, peer))
        cells.append(_cell(ours.get("prefill_tok_s"), theirs.get("prefill_tok_s")))
        cells.append(_load_cell(ours, theirs))
        cells.append(_span_cell(ours, theirs))
        lines.append(f"| {Path(model).name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def engines(model: str, args) -> tuple[bool, bool]:
    """Whether toolkit and llama.cpp run on ``model`` (llama.cpp: a GGUF of ``--models``, with a build)."""
    return not args.skip_toolkit, bool(not args.skip_llamacpp and model in args.models and args.llama_build)


def run_both(model: str, res: dict, args) -> tuple[bool, bool]:
    """Each engine's speed runs on ``model`` into ``res``; whether toolkit and llama.cpp ran without an error."""
    ours, theirs = engines(model, args)
    if ours:
        res["toolkit"] = run_toolkit(model, args, args.out)
        print(model, "toolkit", json.dumps({k: v for k, v in res["toolkit"].items() if k != "rows"}), flush=True)
    if theirs:
        try:
            res["llamacpp"] = {**llama_bench(args.llama_build, model, args.prompt, args.output_len)}
            batched = llama_batched_bench(args.llama_build, model, args.batches, args.input_len, args.output_len)
            res["llamacpp"]["decode_tok_s"] = batched["decode_tok_s"]
            res["llamacpp"]["batched_command"] = batched["command"]
            if "load_s" in batched:
                res["llamacpp"]["load_s"] = batched["load_s"]
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            stderr = getattr(exc, "stderr", "") or ""
            res["llamacpp"] = {"error": f"{exc} {stderr[-2000:]}"}
        print(model, "llama.cpp", json.dumps(res["llamacpp"]), flush=True)
    return tuple(side in res and "error" not in res[side] for side in ("toolkit", "llamacpp"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=[], help="GGUF files (both engines)")
    parser.add_argument("--extra-model", nargs="*", default=[], help="toolkit only (e.g. a safetensors dir)")
    parser.add_argument("--llama-build", type=Path, help="llama.cpp build directory (with bin/llama-bench)")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--skip-toolkit", action="store_true")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCHES)))
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=512, help="prefill length")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--load-runs", type=int, default=5,
                        help="also time each engine's load alone in this many fresh processes; the table's load "
                             "cell is then the two medians (0: the one load of each benchmark process)")
    parser.add_argument("--loads-only", action="store_true",
                        help="no speed runs: only the repeated loads of each engine, in turns (a load measured on a "
                             "machine the speed runs have not just worked)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.batches = tuple(int(b) for b in args.batch_sizes.split(","))
    if args.worker:
        toolkit_worker(args.worker, args.batches, args.input_len, args.output_len, args.prompt, args.worker_json,
                       args.device)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for model in args.models + args.extra_model:
        res = results.setdefault(model, {})
        if args.loads_only:  # no speed runs: each engine that would run gets only its repeated loads
            ours, theirs = engines(model, args)
            res.update({side: {} for side, runs in (("toolkit", ours), ("llamacpp", theirs)) if runs})
        else:
            ours, theirs = run_both(model, res, args)
        if args.load_runs > 0 and (ours or theirs):
            times = interleaved_load_times(model, args, ours, theirs)
            for side, key, name in (("toolkit", "toolkit", "load_runs_s"), ("toolkit", "toolkit_span", "span_runs_s"),
                                    ("llamacpp", "llamacpp", "load_runs_s")):
                if times[key]:
                    res[side][name] = times[key]
            print(model, "loads", json.dumps(times), flush=True)
        (args.out / "vs_llamacpp.json").write_text(json.dumps(results, indent=2))
    text = table(results, args.batches)
    (args.out / "vs_llamacpp.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
