"""Engine A/B of the one-token Gluon GEMV's launch rules: ``toolkit bench`` in fresh processes, arms in turns.

    python bench/ab_gemv_rules.py /tmp/m/llama-1.5B-Q8_0.gguf --arms shipped swept:sweep.json --rounds 2
    git show 5373438^:toolkit/kernels/gguf/gluon_gemv_ops.py > /tmp/old_ops.py
    python bench/ab_gemv_rules.py /tmp/m/llama-1.5B-Q4_0.gguf --arms shipped rules:/tmp/old_ops.py

Arms:
- ``shipped``: the rules as installed;
- ``swept:FILE``: at each shape ``bench/sweep_gluon_gemv.py --json FILE`` swept, the launch it proposes
  (``proposed_rules``: the fastest Gluon launch where it beat the Triton GEMV), no other launch; every other shape
  (and a swept shape with no proposal) as shipped;
- ``rules:FILE``: ``GEMV_RULES`` and ``DEVICE_GEMV_RULES`` as another revision's ``gluon_gemv_ops.py`` (FILE) sets
  them, in place of the shipped ones;
- ``off:TYPES``: ``TOOLKIT_GGUF_GLUON_GEMV`` without those types (comma-separated): they take the Triton GEMV.

Each process loads the model and runs ``toolkit bench --batch-sizes B --input-len 128 --output-len 128``; the table
gives each round's mean TPOT and output tokens/s per model and arm. A GPU figure holds for the GPU it names.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))


def revision_rules(path: str) -> dict:
    """``GEMV_RULES`` and ``DEVICE_GEMV_RULES`` of a ``gluon_gemv_ops.py`` of any revision, evaluated from its module-level
    assignments (the rules are literals of ints, ``1 << 40`` and the module's constants; no import is run)."""
    tree = ast.parse(open(path).read(), path)
    scope: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                scope[node.targets[0].id] = eval(compile(ast.Expression(node.value), path, "eval"),  # noqa: S307
                                                 {"__builtins__": {}}, dict(scope))
            except Exception:  # noqa: BLE001 - assignments that call code (layouts, functions) are not rules
                continue
    if "GEMV_RULES" not in scope:
        raise SystemExit(f"{path}: no GEMV_RULES assignment")
    return {"GEMV_RULES": scope["GEMV_RULES"], "DEVICE_GEMV_RULES": scope.get("DEVICE_GEMV_RULES", {})}


def apply_arm(arm: str) -> None:
    """Set this process's rules (or environment) for ``arm`` before the engine loads."""
    from toolkit.kernels.gguf import gluon_gemv_ops

    kind, _, value = arm.partition(":")
    if kind == "shipped":
        return
    if kind == "off":
        kept = [name for name in gluon_gemv_ops.UNIT_COLUMNS if name not in value.split(",")]
        os.environ["TOOLKIT_GGUF_GLUON_GEMV"] = ",".join(kept) or "0"
    elif kind == "rules":
        rules = revision_rules(value)
        gluon_gemv_ops.GEMV_RULES.clear()
        gluon_gemv_ops.GEMV_RULES.update(rules["GEMV_RULES"])
        gluon_gemv_ops.DEVICE_GEMV_RULES.clear()
        gluon_gemv_ops.DEVICE_GEMV_RULES.update(rules["DEVICE_GEMV_RULES"])
    elif kind == "swept":
        from sweep_gluon_gemv import proposed_rules
        proposed = proposed_rules(json.load(open(value)))
        print(f"swept rules: {proposed}", flush=True)
        gluon_gemv_ops.gemv_launch = _swept_launch(gluon_gemv_ops, proposed)  # dp4a_ops looks it up at each call
    else:
        raise SystemExit(f"unknown arm {arm!r} (shipped, swept:FILE, rules:FILE, off:TYPES)")


def _swept_launch(ops, proposed: dict):
    """``gemv_launch`` that takes a swept shape's proposed launch (through the shipped function, with that one rule
    and no device rules, so its checks of the device, alignment and switches still apply) and leaves every other
    shape to the shipped rules."""
    exact = {(name, rule[5], rule[6]): rule for name, rules in proposed.items() for rule in rules}
    shipped = ops.gemv_launch

    def gemv_launch(name, data, cols, *vectors):
        rule = exact.get((name, data.shape[0], cols))
        if rule is None:
            return shipped(name, data, cols, *vectors)
        with mock.patch.dict(ops.GEMV_RULES, {name: (rule,)}), mock.patch.object(ops, "_device_rules",
                                                                                 lambda device: {}):
            return shipped(name, data, cols, *vectors)
    return gemv_launch


def run_one(arm: str, model: str, out: str, batch_sizes: str) -> None:
    sys.path.insert(0, HERE)
    apply_arm(arm)
    from toolkit.core.cli import main
    main(["bench", model, "--batch-sizes", batch_sizes, "--input-len", "128", "--output-len", "128", "--json", out])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="GGUF files")
    parser.add_argument("--arms", nargs="+", default=["shipped"], help="shipped, swept:FILE, rules:FILE, off:TYPES")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-sizes", default="1")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one bench process may take")
    parser.add_argument("--one", nargs=3, metavar=("ARM", "MODEL", "JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        run_one(*args.one, args.batch_sizes)
        return
    if not args.models:
        parser.error("name at least one GGUF file")
    print("| round | model | arm | batch | mean TPOT ms | out tok/s |\n|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "bench.json")
        for round_ in range(1, args.rounds + 1):
            for model in args.models:
                for arm in args.arms:
                    command = [sys.executable, os.path.abspath(__file__), "--one", arm, model, out,
                               "--batch-sizes", args.batch_sizes]
                    try:
                        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
                    except subprocess.TimeoutExpired:
                        print(f"| {round_} | {os.path.basename(model)} | {arm} | - | timed out | |", flush=True)
                        continue
                    if done.returncode:
                        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                        print(f"| {round_} | {os.path.basename(model)} | {arm} | - | failed: {' / '.join(tail)} | |",
                              flush=True)
                        continue
                    for row in json.load(open(out))["results"]:
                        print(f"| {round_} | {os.path.basename(model)} | {arm} | {row['batch_size']} | "
                              f"{row['mean_tpot_ms']:.4f} | {row['output_tokens_per_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
