"""bench/bench_vs_llamacpp.py reads llama.cpp's own output formats (llama-bench's JSON array,
llama-batched-bench's JSONL, in the field names of the vendored 0.3.36 source) and builds the
ratio table. The binaries themselves run only on the device; here their output is replayed."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "bench" / "bench_vs_llamacpp.py"


@pytest.fixture()
def bench(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_vs_llamacpp", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "bin").mkdir()
    for name in ("llama-bench", "llama-batched-bench"):
        (tmp_path / "bin" / name).touch()
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        if cmd[0].endswith("llama-bench"):
            rows = [{"n_prompt": 512, "n_gen": 0, "avg_ts": 40000.5}, {"n_prompt": 0, "n_gen": 128, "avg_ts": 990.0}]
            log = ("llama_model_loader: loaded meta data\nllama_perf_context_print:        load time =     271.50 ms\n"
                   "llama_perf_context_print:        load time =     999.00 ms\n")  # -v: the log, one per test
            return subprocess.CompletedProcess(cmd, 0, "ggml_cuda_init: 1 device\n" + json.dumps(rows), log)
        lines = [json.dumps({"pp": 128, "tg": 128, "pl": pl, "speed_tg": speed, "speed_pp": 1.0})
                 for pl, speed in ((1, 950.0), (8, 4500.0))]
        return subprocess.CompletedProcess(cmd, 0, "", "log line\n" + "\n".join(lines) + "\n")

    monkeypatch.setattr(module.subprocess, "run", fake_run)
    return module, tmp_path, calls


def test_llama_cpp_outputs_are_parsed_and_the_flags_are_the_issues(bench):
    module, build, calls = bench
    single = module.llama_bench(build, "m.gguf", 512, 128)
    batched = module.llama_batched_bench(build, "m.gguf", (1, 8), 128, 128)
    assert single["prefill_tok_s"] == 40000.5 and single["decode_b1_tok_s"] == 990.0
    assert batched["decode_tok_s"] == {1: 950.0, 8: 4500.0}
    assert calls[0][1:] == ["-m", "m.gguf", "-fa", "1", "-p", "512", "-n", "128", "-ngl", "99", "-o", "json", "-v"]
    assert single["load_s"] == 0.2715                      # the first test's load time, from the -v log
    assert "load_s" not in batched and batched["load_lines"] == []  # no such line: what mentioned loading
    flags = dict(zip(calls[1][1::2], calls[1][2::2]))
    assert flags["-npp"] == "128" and flags["-ntg"] == "128" and flags["-npl"] == "1,8" and flags["-fa"] == "on"
    assert int(flags["-c"]) >= 8 * 256  # every sequence's prompt and generation fit


def test_table_takes_llama_cpps_better_batch_one_figure_and_divides(bench):
    module, _, _ = bench
    results = {"m.gguf": {"toolkit": {"decode_tok_s": {1: 500.0, 8: 9000.0}, "prefill_tok_s": 20000.0, "load_s": 1.0},
                          "llamacpp": {"decode_b1_tok_s": 1000.0, "decode_tok_s": {1: 950.0, 8: 4500.0},
                                       "prefill_tok_s": 40000.0}}}
    table = module.table(results, (1, 8))
    assert "1,000 / 500 = **0.50x**" in table          # max(llama-bench tg, batched B=1)
    assert "4,500 / 9,000 = **2.00x**" in table
    assert "40,000 / 20,000 = **0.50x**" in table


def test_repeated_llama_cpp_loads_do_the_least_and_the_table_shows_both_medians(bench):
    """``--load-runs``: llama.cpp's load time from fresh one-token llama-bench processes (the replayed ``-v`` log's
    first ``load time`` each); the load cell is then the median of each engine's repeated loads, not one
    process's."""
    module, build, calls = bench
    stderr = iter(["llama_perf_context_print:        load time =     300.00 ms\n",
                   "llama_perf_context_print:        load time =     350.00 ms\n",
                   "llama_perf_context_print:        load time =     310.00 ms\n"])
    module.subprocess.run = lambda cmd, **kwargs: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "",
                                                                                                   next(stderr))
    assert [module.llama_load_time(build, "m.gguf") for _ in range(3)] == [0.3, 0.35, 0.31]
    assert calls[0][0].endswith("llama-bench") and calls[0][-1] == "-v"
    flags = dict(zip(calls[0][1:-1:2], calls[0][2:-1:2]))
    assert (flags["-p"], flags["-n"], flags["-r"], flags["-ngl"]) == ("0", "1", "1", "99")
    results = {"m.gguf": {"toolkit": {"decode_tok_s": {1: 500.0}, "load_s": 0.9, "load_runs_s": [0.25, 0.4, 0.2]},
                          "llamacpp": {"decode_tok_s": {1: 400.0}, "load_s": 0.29, "load_runs_s": [0.3, 0.35, 0.31]}}}
    assert "| 0.31 / 0.25 (median of 3 / 3) |" in module.table(results, (1,))
    del results["m.gguf"]["llamacpp"]["load_runs_s"]                  # one side without repeats: the single loads
    assert "| 0.29 / 0.90 |" in module.table(results, (1,))


def test_repeated_loads_alternate_between_the_engines_after_a_sync(bench, monkeypatch):
    """The repeated loads take turns (toolkit, llama.cpp, toolkit, ...) so that both engines sample the same moments
    of the machine, after ``os.sync`` (files just written leave dirty pages); an engine that did not run (skipped or
    failed) gets none."""
    module, build, _ = bench
    order = []
    monkeypatch.setattr(module.os, "sync", lambda: order.append("sync"))
    monkeypatch.setattr(module, "toolkit_load_time",
                        lambda model, device: order.append("toolkit") or {"load_s": 0.2, "span_s": 0.25})
    monkeypatch.setattr(module, "llama_load_time", lambda build, model: order.append("llama") or 0.3)
    args = type("Args", (), {"load_runs": 3, "device": "cuda", "llama_build": build})()
    assert module.interleaved_load_times("m.gguf", args, True, True) == {"toolkit": [0.2] * 3,
                                                                          "toolkit_span": [0.25] * 3,
                                                                          "llamacpp": [0.3] * 3}
    assert order == ["sync"] + ["toolkit", "llama"] * 3
    order.clear()
    assert module.interleaved_load_times("m.gguf", args, True, False) == {"toolkit": [0.2] * 3,
                                                                           "toolkit_span": [0.25] * 3, "llamacpp": []}
    assert order == ["sync"] + ["toolkit"] * 3


def test_loads_only_runs_no_speed_benchmark_and_tables_the_load_medians(bench, monkeypatch, tmp_path):
    """``--loads-only``: each engine's repeated loads in turns and nothing else (so the loads can be measured on a
    machine the speed runs have not just worked); the speed cells stay empty."""
    module, build, _ = bench

    def no_speed_run(*args, **kwargs):
        raise AssertionError("a speed run in --loads-only")

    for name in ("run_toolkit", "llama_bench", "llama_batched_bench"):
        monkeypatch.setattr(module, name, no_speed_run)
    monkeypatch.setattr(module.os, "sync", lambda: None)
    toolkit_loads, llama_loads = iter([0.21, 0.25, 0.19]), iter([0.2, 0.18, 0.22])
    spans = iter([0.3, 0.26, 0.28])
    monkeypatch.setattr(module, "toolkit_load_time",
                        lambda model, device: {"load_s": next(toolkit_loads), "span_s": next(spans)})
    monkeypatch.setattr(module, "llama_load_time", lambda build, model: next(llama_loads))
    out = tmp_path / "vs"
    monkeypatch.setattr(module.sys, "argv", ["bench", "--llama-build", str(build), "--loads-only", "--load-runs", "3",
                                             "--batch-sizes", "1", "--out", str(out), "--models", "m.gguf"])
    module.main()
    # the span cell: llama.cpp's median load time against the median of toolkit's build-through-first-token spans
    assert "| m.gguf | - / - | - / - | 0.20 / 0.21 (median of 3 / 3) | 0.20 / 0.28 |" in \
        (out / "vs_llamacpp.md").read_text()
    saved = json.loads((out / "vs_llamacpp.json").read_text())["m.gguf"]
    assert saved == {"toolkit": {"load_runs_s": [0.21, 0.25, 0.19], "span_runs_s": [0.3, 0.26, 0.28]},
                     "llamacpp": {"load_runs_s": [0.2, 0.18, 0.22]}}
