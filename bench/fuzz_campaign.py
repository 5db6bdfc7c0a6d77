"""A seeded fuzzing campaign over mutated checkpoints of every format; prints counts by outcome.

    nice -n 10 python bench/fuzz_campaign.py --cases 10000            # seed 0, 2 workers
    python bench/fuzz_campaign.py --seed 0 --replay 461               # one case, in-process, with traceback

Each case is a tiny seed checkpoint (GGUF, safetensors, index, .bin, bnb, sharded, tensorizer)
damaged by one mutation chosen from (seed, case id) alone (tests/fuzz_mutations.py), loaded in a
forked child under a time limit and a memory limit (tests/fuzz_runner.py). Outcomes: loaded,
typed error, untyped exception, hang, crash, allocator failure; also how many typed errors fail
to name a file of the case. Every bad case is listed with its id (replay it with --replay).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzz_mutations import make_case  # noqa: E402
from fuzz_runner import BAD, OUTCOMES, attempt, counts, run_cases  # noqa: E402
from fuzz_seeds import build_seeds  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="first case id")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=10.0, help="CPU seconds per case before it counts as a hang (wall clock: 12x, at least 60 s)")
    parser.add_argument("--memory-gib", type=float, default=2.0, help="address space a case may add")
    parser.add_argument("--workdir", default=None, help="where seeds and cases go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the files of bad cases")
    parser.add_argument("--replay", type=int, default=None, help="run this case id in-process and show its result")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="toolkit-fuzz-"))
    seeds = build_seeds(workdir / "seeds")
    if args.replay is not None:
        return replay(args.seed, args.replay, seeds, workdir)
    started = time.monotonic()
    seen: list = []

    def progress(result) -> None:
        seen.append(result)
        if len(seen) % 500 == 0:
            table = counts(seen)
            unnamed = sum(1 for r in seen if r.outcome == "typed" and not r.names_file)
            print(f"  {len(seen)}/{args.cases} cases, {time.monotonic() - started:.0f} s: "
                  + ", ".join(f"{k} {v}" for k, v in table.items()) + f", unnamed {unnamed}", flush=True)
            for bad in (r for r in seen[-500:] if r.outcome in BAD):
                print(f"    [{bad.outcome}] case {bad.case_id} ({bad.kind}) {bad.mutation[:80]}: {bad.detail[:200]}",
                      flush=True)

    results = run_cases(args.seed, range(args.start, args.start + args.cases), seeds, workdir / "cases",
                        workers=args.workers, timeout=args.timeout, memory_bytes=int(args.memory_gib * (1 << 30)),
                        keep=args.keep, on_result=progress)
    elapsed = time.monotonic() - started
    table = counts(results)
    unnamed = [r for r in results if r.outcome == "typed" and not r.names_file]
    print(f"\n{len(results)} cases, seed {args.seed}, ids {args.start}..{args.start + args.cases - 1}, "
          f"{elapsed:.0f} s, {args.workers} workers, limit {args.timeout:.0f} s CPU / +{args.memory_gib} GiB per case")
    for outcome in OUTCOMES:
        print(f"  {outcome:10s} {table.get(outcome, 0):6d}")
    print(f"  typed errors not naming a file of the case: {len(unnamed)}")
    by_kind: dict[str, dict[str, int]] = {}
    for result in results:
        by_kind.setdefault(result.kind, {}).setdefault(result.outcome, 0)
        by_kind[result.kind][result.outcome] += 1
    print("  by seed kind: " + "; ".join(f"{k}: {v}" for k, v in sorted(by_kind.items())))
    bad = sorted((r for r in results if r.outcome in BAD or r in unnamed), key=lambda r: r.case_id)
    for result in bad[:200]:
        print(f"  [{result.outcome}] case {result.case_id} ({result.kind}) {result.mutation[:90]}\n"
              f"      {result.detail[:400]}")
    return 1 if bad else 0


def replay(seed: int, case_id: int, seeds, workdir: Path) -> int:
    case = make_case(seed, case_id, seeds, workdir / "replay")
    print(f"case {case_id} ({case.kind}): {case.mutation}\n  files under {case.folder}")
    outcome, detail, names_file = attempt(case)
    print(f"  {outcome}: {detail}\n  names a file of the case: {names_file}")
    if outcome == "untyped":
        import toolkit  # noqa: PLC0415

        toolkit.load(str(case.path), device="cpu").logits([0, 1, 2])  # re-raise with the full traceback
    return 0 if outcome not in BAD else 1


if __name__ == "__main__":
    sys.exit(main())
