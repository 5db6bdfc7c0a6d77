"""bench/bench_load_phases.py's span of llama.cpp's load time, and the report's phase starts it reads.

llama.cpp's "load time" starts after its loader has parsed the file (our ``plugins`` and ``open``)
and ends with its first evaluation; ``--first-token`` times that stretch on our side from the
``build`` phase's start. The checks here hold the figure against the load's own phase durations,
measured separately, so a span started at the wrong moment fails them.
"""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from gguf_fixtures import Spec, write_model
from toolkit.core.report import LoadReport

PATH = Path(__file__).resolve().parents[1] / "bench" / "bench_load_phases.py"
AFTER_OPEN = ("build", "load_weights", "finish", "tokenizer")  # the phases inside llama.cpp's span


def test_a_phase_keeps_the_moment_it_first_began():
    report = LoadReport()
    before = time.perf_counter()
    with report.phase("open"):
        pass
    with report.phase("build"):
        time.sleep(0.01)
    first_build = report.phase_starts["build"]
    with report.phase("build"):  # a phase entered again adds its time, and keeps its first start
        pass
    assert before <= report.phase_starts["open"] <= first_build == report.phase_starts["build"]
    assert report.phases["build"] >= 0.01
    assert list(report.phase_starts) == ["open", "build"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_load_phases", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_span_runs_from_the_build_phase_through_the_first_token(bench, tmp_path):
    run = bench.run_once(str(write_model(tmp_path / "tiny.gguf", Spec(qtype=Q.Q8_0))), "cpu", first_token=True)
    phases, first = run["phases"], run["first_token_s"]
    inside = run["llama_span_s"] - first  # the part of the span inside toolkit.load
    assert first > 0
    # at least the phases after the open, at most the load less the phases before its start
    assert sum(phases[name] for name in AFTER_OPEN) <= inside
    assert inside <= run["load_s"] - phases["plugins"] - phases["resolve"] - phases["open"]


def test_without_the_first_token_there_is_no_span(bench, tmp_path):
    run = bench.run_once(str(write_model(tmp_path / "tiny.gguf", Spec(qtype=Q.Q8_0))), "cpu")
    assert run["first_token_s"] is None and run["llama_span_s"] is None
    assert bench.summarize([run])["llama_span_s"] is None


def test_a_failing_first_token_is_reported_and_the_load_still_counts(bench, tmp_path, monkeypatch):
    """The benchmark's repeated loads take a token each; a token that fails must not take the load figures with it."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import toolkit.core.loaded as loaded\n"
        "def broken(self, *args, **kwargs):\n"
        "    raise RuntimeError('no token today')\n"
        "loaded.LoadedModel.generate = broken\n")
    monkeypatch.setenv("PYTHONPATH", f"{hook}:{os.environ.get('PYTHONPATH', '')}")
    run = bench.run_once(str(write_model(tmp_path / "tiny.gguf", Spec(qtype=Q.Q8_0))), "cpu", first_token=True)
    assert run["load_s"] > 0 and run["first_token_s"] is None and run["llama_span_s"] is None
    assert run["first_token_error"] == "RuntimeError: no token today"
    assert bench.summarize([run])["first_token_errors"] == ["RuntimeError: no token today"]
