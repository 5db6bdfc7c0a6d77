"""Issue 14: a bounded, seeded fuzz run over mutated checkpoints of every format.

Every case is reproducible by (seed, id): ``python bench/fuzz_campaign.py --seed 14 --replay ID``.
Each load runs in a forked child under a time and memory limit (tests/fuzz_runner.py). No case
may end in an untyped exception, a hang, a crash or an allocator failure, and every typed error
must name a file of the case. The long campaign (10,000 cases) is bench/fuzz_campaign.py.
"""
from __future__ import annotations

import os

import pytest

from fuzz_runner import BAD, counts, run_cases
from fuzz_seeds import build_seeds

SEED = 14
CASES = 240
TIMEOUT = 10.0  # CPU seconds per case (wall-clock allows 12x that: a loaded CI machine is slow, not hung)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the runner forks one child per case")
def test_bounded_fuzz_run_has_only_typed_errors(tmp_path_factory):
    seeds = build_seeds(tmp_path_factory.mktemp("fuzz-seeds"))
    assert {"gguf-llama", "gguf-qwen2", "safetensors", "index", "bin", "sharded"} <= set(seeds)
    results = run_cases(SEED, range(CASES), seeds, tmp_path_factory.mktemp("fuzz-cases"), workers=2,
                        timeout=TIMEOUT)
    table = counts(results)
    bad = [f"case {r.case_id} ({r.kind}, {r.mutation}): {r.outcome} {r.detail}" for r in results if r.outcome in BAD]
    assert not bad, f"{table}\n" + "\n".join(bad)
    unnamed = [f"case {r.case_id}: {r.detail}" for r in results if r.outcome == "typed" and not r.names_file]
    assert not unnamed, "\n".join(unnamed)
    # the mutations must reach past the parsers: most cases fail typed, some still load
    assert table["typed"] > CASES // 2 and table["loaded"] > 0, table
    assert len({r.kind for r in results}) == len(seeds)


# ---- the runner's own guards (so a clean fuzz run means something) -----------------------------------
def _fake_case(tmp_path):
    from fuzz_mutations import Case  # noqa: PLC0415

    return Case(0, 0, "none", "none", tmp_path / "model", tmp_path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the runner forks one child per case")
def test_runner_reports_busy_loops_as_hangs(tmp_path, monkeypatch):
    import fuzz_runner  # noqa: PLC0415

    def spin(case):
        while True:
            pass
    monkeypatch.setattr(fuzz_runner, "attempt", spin)
    assert fuzz_runner.run_isolated(_fake_case(tmp_path), timeout=1).outcome == "hang"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the runner forks one child per case")
def test_runner_reports_allocator_failures_and_crashes(tmp_path, monkeypatch):
    import torch  # noqa: PLC0415

    import fuzz_runner  # noqa: PLC0415
    import toolkit  # noqa: PLC0415

    monkeypatch.setattr(toolkit, "load", lambda *args, **kwargs: torch.empty(1 << 40, dtype=torch.uint8))
    assert fuzz_runner.run_isolated(_fake_case(tmp_path), memory_bytes=1 << 28).outcome == "alloc"
    monkeypatch.setattr(toolkit, "load", lambda *args, **kwargs: os.abort())
    result = fuzz_runner.run_isolated(_fake_case(tmp_path))
    assert result.outcome.startswith("crash") and str(int(__import__("signal").SIGABRT)) in result.outcome
    monkeypatch.setattr(toolkit, "load", lambda *args, **kwargs: {}[1])
    assert fuzz_runner.run_isolated(_fake_case(tmp_path)).outcome == "untyped"
