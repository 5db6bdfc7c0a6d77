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
TIMEOUT = 30.0  # seconds per case: generous for a loaded CI machine; the campaign uses 10


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
