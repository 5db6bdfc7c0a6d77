"""bench/sweep_gluon_gemv.py's rules from a sweep and bench/ab_gemv_rules.py's arms (their host logic; the timings
themselves need a GPU)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from test_gluon_gemv import _packed
from toolkit.kernels.gguf import gluon_gemv_ops

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _module(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


sweep = _module("sweep_gluon_gemv")
ab = _module("ab_gemv_rules")


SWEEP = {"rows": [
    # 4096x14336: 8,2,1,2 is fastest in its best round (17.0 < 17.5) and 10% ahead of the Triton GEMV
    {"type": "Q8_0", "shape": "4096x14336", "times": {"triton": [19.0, 18.9], "rule": [19.1, 18.9],
                                                      "8,1,1,0": [17.5, 18.0], "8,2,1,2": [17.9, 17.0]}},
    # 2048x2048: 1% ahead only: no rule at a 2% margin
    {"type": "Q8_0", "shape": "2048x2048", "times": {"triton": [2.00], "rule": [2.00], "8,4,4,0": [1.98]}},
    # 16384x2048: a launch with a register cap, ahead
    {"type": "Q8_0", "shape": "16384x2048", "times": {"triton": [9.0], "rule": [9.0], "4,2,1,0,255": [8.0]}},
    # a baseline faster than every launch is no rule, whatever "rule" measured
    {"type": "Q4_0", "shape": "3072x2048", "times": {"triton": [3.0], "rule": [2.0], "8,4,4,0": [2.9]}},
    {"type": "Q4_0", "shape": "2048x2048", "times": {"triton": [3.0], "rule": [2.5]}},
]}


def test_proposed_rules_take_the_fastest_launch_ahead_of_the_triton_gemv_by_the_margin():
    assert sweep.proposed_rules(SWEEP) == {
        "Q8_0": ((4, 2, 1, 0, 255, 16384, 2048, 2048), (8, 2, 1, 2, 0, 4096, 14336, 14336)),
        "Q4_0": ((8, 4, 4, 0, 0, 3072, 2048, 2048),)}
    assert sweep.proposed_rules(SWEEP, margin=0.005)["Q8_0"][-1] == (8, 4, 4, 0, 0, 2048, 2048, 2048)
    assert "Q4_0" not in sweep.proposed_rules(SWEEP, margin=0.05)


def test_a_launch_is_four_or_five_numbers():
    assert sweep.parse_launch("8,2,1,2") == (8, 2, 1, 2)
    assert sweep.parse_launch("1,1,1,7,255") == (1, 1, 1, 7, 255)
    with pytest.raises(ValueError, match="step,rows per thread"):
        sweep.parse_launch("8,2,1")


def test_revision_rules_read_without_importing(tmp_path):
    """The shipped module's rules as ``revision_rules`` evaluates them from its source equal the imported ones; a file
    of another revision gives its own (constants it names resolved; assignments that call code skipped)."""
    shipped = ab.revision_rules(gluon_gemv_ops.__file__)
    assert shipped["GEMV_RULES"] == gluon_gemv_ops.GEMV_RULES
    assert shipped["DEVICE_GEMV_RULES"] == gluon_gemv_ops.DEVICE_GEMV_RULES
    old = tmp_path / "old_ops.py"
    old.write_text("import os\nCAP = 64\nLAYOUT = make_layout(4)\n"
                   "GEMV_RULES = {'Q4_0': ((8, 2, 4, 0, CAP, 0, 0, 1 << 40),)}\n")
    assert ab.revision_rules(str(old)) == {"GEMV_RULES": {"Q4_0": ((8, 2, 4, 0, 64, 0, 0, 1 << 40),)},
                                           "DEVICE_GEMV_RULES": {}}
    (tmp_path / "none.py").write_text("X = 1\n")
    with pytest.raises(SystemExit, match="no GEMV_RULES"):
        ab.revision_rules(str(tmp_path / "none.py"))


def test_swept_arm_takes_the_proposal_at_swept_shapes_only(monkeypatch):
    """At a swept shape the proposed launch, ahead of an H200 device rule; elsewhere the shipped rules (Q8_0, with none
    shipped: the Triton GEMV); the rules and the device rules are as before after each call; alignment still checked."""
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV_LAUNCH", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_DEVICE_RULES", raising=False)
    monkeypatch.setattr(gluon_gemv_ops, "_runs_on", lambda device, kernels=None: True)
    monkeypatch.setattr(gluon_gemv_ops, "_device_name", lambda device: "NVIDIA H200")
    before = dict(gluon_gemv_ops.GEMV_RULES)
    proposed = {"Q8_0": ((8, 2, 1, 2, 0, 4096, 14336, 14336),), "Q4_0": ((8, 1, 1, 0, 0, 4096, 14336, 14336),)}
    launch = ab._swept_launch(gluon_gemv_ops, proposed)
    assert launch("Q8_0", _packed("Q8_0", 4096, 14336), 14336) == (8, 2, 1, 2, 0)
    assert launch("Q8_0", _packed("Q8_0", 8192, 14336), 14336) is None            # not swept: none shipped
    assert gluon_gemv_ops.gemv_launch("Q4_0", _packed("Q4_0", 4096, 14336), 14336) == (8, 2, 4, 2, 0)  # H200 rule
    assert launch("Q4_0", _packed("Q4_0", 4096, 14336), 14336) == (8, 1, 1, 0, 0)
    assert launch("Q4_0", _packed("Q4_0", 2048, 2048), 2048) == gluon_gemv_ops.gemv_launch(
        "Q4_0", _packed("Q4_0", 2048, 2048), 2048)
    flat = torch.zeros(4096 * 15232 + 4, dtype=torch.uint8)[4:].view(4096, 15232)  # rows off a 16-byte boundary
    assert launch("Q8_0", flat, 14336) is None
    assert gluon_gemv_ops.GEMV_RULES == before
    assert "TOOLKIT_GGUF_GLUON_DEVICE_RULES" not in os.environ
    assert gluon_gemv_ops.gemv_launch("Q4_0", _packed("Q4_0", 4096, 14336), 14336) == (8, 2, 4, 2, 0)  # H200 rule back


def test_off_arm_keeps_the_other_types_on_gluon(monkeypatch):
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_GEMV", raising=False)
    ab.apply_arm("off:Q8_0,Q4_0")
    kept = os.environ["TOOLKIT_GGUF_GLUON_GEMV"].split(",")
    assert sorted(kept) == sorted(set(gluon_gemv_ops.UNIT_COLUMNS) - {"Q8_0", "Q4_0"})
    with pytest.raises(SystemExit, match="unknown arm"):
        ab.apply_arm("fastest")
