"""Sweep the one-token Gluon GEMV's launches against the Triton dp4a GEMV, as a decode step runs them (CUDA, sm_90).

    python bench/sweep_gluon_gemv.py --types Q8_0 --shapes 4096x14336,14336x4096 --json sweep.json
    python bench/sweep_gluon_gemv.py --types Q4_0 --shapes 3072x2048 --launches 8,2,4,0 8,4,4,0

Per type and weight shape (``rows x cols``) it times, in engine form (x's int8 blocks made once and attached as the
norms hand them, split-K partial sums handed on unreduced), each over enough distinct weight copies that none is in
L2 when reused, inside one CUDA graph, rounds in turns:

- ``triton``: the dp4a GEMV at its rule (``gemv_launch.tokens_config``);
- ``rule``: what the dispatch takes today (``gluon_gemv_ops.gemv_launch``: a Gluon launch, or the Triton GEMV);
- each Gluon launch of ``--launches`` (``step,rows per thread,warps,split[,register cap]``, as
  ``TOOLKIT_GGUF_GLUON_GEMV_LAUNCH``), after its reduced output has matched the Triton GEMV's on the same int8
  activations (only the order of the float sums differs; a launch off by more is reported and not timed).

It prints one line per shape (fastest label, each label's fastest and slowest round, GB/s as a share of a device
copy) and with ``--json`` writes every round. ``proposed_rules`` turns such a file into ``GEMV_RULES``-form launches
(the fastest Gluon launch of each shape that beat the Triton GEMV by a margin); ``bench/ab_gemv_rules.py`` runs the
engine with them. Numerical tests of the kernels against gguf-py are tests/test_gluon_gemv*.py (``-m gpu``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gguf_kernels import (copies_for, copy_bandwidth, graph_us, handed_on, packed_bytes,  # noqa: E402
                                random_packed)

# Launches tried by default per type: the rules' launches and their neighbours (rows per thread, warps, K split).
LAUNCHES = {
    "Q8_0": ("8,1,1,0", "8,2,1,0", "8,4,1,0", "8,2,4,0", "8,4,4,0", "8,1,1,2", "8,2,1,2", "8,2,4,2", "4,1,1,0",
             "4,2,1,0"),
    "Q4_0": ("8,1,1,0", "8,2,1,0", "8,2,4,0", "8,4,4,0", "8,4,1,0", "8,2,1,2", "8,2,4,2", "8,1,4,0"),
    "Q4_K": ("8,2,4,1", "8,4,1,0", "8,4,4,1", "8,2,1,0", "8,4,4,0", "8,2,4,0", "4,2,1,0", "8,4,1,1"),
    "Q5_K": ("8,2,4,0", "8,4,1,0", "8,2,1,0", "8,4,4,0", "8,2,4,2", "8,4,1,2"),
    "Q6_K": ("1,1,1,7", "1,2,1,7", "1,1,1,7,255", "1,2,1,7,255", "2,1,1,7", "1,1,4,7"),
}
BASELINES = ("triton", "rule")
MATCH = 2e-2          # largest |gluon - triton| / max |triton| of a launch that is timed


def parse_launch(text: str) -> tuple[int, ...]:
    """``"8,2,1,2"`` -> ``(8, 2, 1, 2)``: a launch as ``TOOLKIT_GGUF_GLUON_GEMV_LAUNCH`` writes it."""
    launch = tuple(int(v) for v in text.split(","))
    if not 4 <= len(launch) <= 5:
        raise ValueError(f"a launch is step,rows per thread,warps,split[,register cap], got {text!r}")
    return launch


def proposed_rules(sweep: dict, margin: float = 0.02) -> dict[str, tuple[tuple[int, ...], ...]]:
    """``GEMV_RULES``-form launches from a ``--json`` file's contents: per type, for each shape whose fastest Gluon
    launch (its fastest round) beat the Triton GEMV's fastest round by more than ``margin``, ``(step, rows per
    thread, warps, split, cap, rows, cols, cols)``, larger row counts first so that ``gemv_launch``'s first match
    of a swept shape is its own. (A rule's rows bound is a least count: an unswept larger weight of the same width
    would take the largest swept shape's launch; ``ab_gemv_rules`` keeps the engine to swept shapes.)"""
    rules: dict[str, list] = {}
    for row in sweep["rows"]:
        times = {label: min(rounds) for label, rounds in row["times"].items()}
        gluon = [(us, label) for label, us in times.items() if label not in BASELINES]
        if not gluon:
            continue
        us, label = min(gluon)
        if us < (1 - margin) * times["triton"]:
            rows, cols = (int(v) for v in row["shape"].split("x"))
            launch = (*parse_launch(label), 0)[:5]
            rules.setdefault(row["type"], []).append((*launch, rows, cols, cols))
    return {name: tuple(sorted(found, key=lambda rule: (-rule[5], rule[6]))) for name, found in rules.items()}


def sweep_shape(name: str, rows: int, cols: int, launches, rounds: int) -> dict:
    """One type and shape: ``{"type", "shape", "rule", "bytes", "times": {label: [us per round]}}``."""
    from gguf import GGMLQuantizationType
    from toolkit.kernels import int8_blocks
    from toolkit.kernels.gguf import dp4a_ops, gemv_launch, gluon_gemv_ops

    qtype, with_sums = int(GGMLQuantizationType[name]), name in gemv_launch.TOKENS_SUM_TYPES
    copies = copies_for(rows, cols)
    weights = [random_packed(name, rows, cols) for _ in range(copies)]
    x = torch.randn(1, cols, device="cuda", dtype=torch.bfloat16)
    handed = handed_on(x, with_sums)
    blocks = int8_blocks.attached(handed, with_sums)
    words, scales, sums = blocks.words, blocks.scales, blocks.sums
    config = gemv_launch.tokens_config(name, 1, rows, cols)
    rule = gluon_gemv_ops.gemv_launch(name, weights[0], cols, words, scales, *([] if sums is None else [sums]))
    fns = {"triton": lambda: [dp4a_ops.dp4a_tokens_matmul(handed, w, qtype, cols, config, unreduced=True)
                              for w in weights],
           "rule": lambda: [dp4a_ops.dp4a_tokens_matmul(handed, w, qtype, cols, unreduced=True) for w in weights]}
    want = dp4a_ops.dp4a_tokens_matmul(handed, weights[0], qtype, cols, config).float()
    for text in launches:
        launch = parse_launch(text)
        try:
            got = gluon_gemv_ops.gluon_gemv(name, words, scales, sums, weights[0], cols, x, launch,
                                            config.split).float()
        except Exception as exc:  # noqa: BLE001 - a launch this shape cannot take is reported, then skipped
            print(f"  {name} {rows}x{cols} {text}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            continue
        error = ((got - want).abs().max() / want.abs().max()).item()
        if not error <= MATCH:
            print(f"  {name} {rows}x{cols} {text}: off the Triton GEMV by {error:.3g} (relative): not timed")
            continue
        fns[text] = lambda launch=launch: [gluon_gemv_ops.gluon_gemv(name, words, scales, sums, w, cols, x, launch,
                                                                     config.split, unreduced=True) for w in weights]
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for label, fn in fns.items():
            times.setdefault(label, []).append(graph_us(fn, copies))
    return {"type": name, "shape": f"{rows}x{cols}", "rule": list(rule) if rule else None,
            "bytes": packed_bytes(name, rows, cols), "times": times}


def describe(row: dict, copy_gbs: float) -> str:
    """One line: the fastest label and each label's fastest-slowest round (us), shares of a device copy."""
    def share(us: float) -> str:
        return f"{100 * row['bytes'] / us / 1e3 / copy_gbs:.0f}%"
    fastest = {label: min(rounds) for label, rounds in row["times"].items()}
    best = min(fastest, key=fastest.get)
    cells = "  ".join(f"{label}={min(r):.2f}-{max(r):.2f}" for label, r in row["times"].items())
    return (f"{row['type']} {row['shape']} rule={row['rule']} fastest={best} {fastest[best]:.2f} us ({share(fastest[best])}"
            f" of copy; triton {share(fastest['triton'])}, rule {share(fastest['rule'])}) | {cells}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q8_0", help="comma-separated GGUF types with a Gluon GEMV")
    parser.add_argument("--shapes", default="4096x14336,14336x4096,28672x4096,2048x8192,16384x2048,3072x2048,"
                        "2048x2048,32000x2048", help="comma-separated weight shapes, rows x cols")
    parser.add_argument("--launches", nargs="*", help="launches to try for every type (default: LAUNCHES[type])")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds, launches in turns within each")
    parser.add_argument("--json", default="", help="also write every round here")
    args = parser.parse_args(argv)
    from toolkit.kernels.gguf import gluon_gemv_ops

    copy_gbs = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}  device-to-device copy: {copy_gbs:.0f} GB/s", flush=True)
    result = {"device": torch.cuda.get_device_name(), "copy_gbs": copy_gbs, "rows": []}
    for name in args.types.split(","):
        for shape in args.shapes.split(","):
            rows, cols = (int(v) for v in shape.split("x"))
            if cols % gluon_gemv_ops.UNIT_COLUMNS[name]:
                print(f"  {name} {shape}: not whole units of {gluon_gemv_ops.UNIT_COLUMNS[name]} columns, skipped")
                continue
            row = sweep_shape(name, rows, cols, args.launches or LAUNCHES[name], args.rounds)
            result["rows"].append(row)
            print(describe(row, copy_gbs), flush=True)
            torch.cuda.empty_cache()
            if args.json:  # after every shape, so a sweep cut short by its time limit still leaves what it timed
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=1)
    if args.json:
        print("proposed rules:", proposed_rules(result))


if __name__ == "__main__":
    main()
