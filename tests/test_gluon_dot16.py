"""The Gluon Q4_K kernel (``kernels/gguf/gluon_dot16``, host side ``gluon_ops``): which calls it takes, its compiled
form for an H100 (no GPU needed), and its numbers against gguf-py's dequantization (on an H100/H200 only: no
interpreter runs Gluon)."""
from __future__ import annotations

import importlib.util
import re
import textwrap

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from toolkit.kernels.gguf import gluon_ops
from triton_interpreter import compile_in_fresh_process

Q4_K = GGMLQuantizationType.Q4_K
HAS_GLUON = importlib.util.find_spec("triton") is not None and \
    importlib.util.find_spec("triton.experimental.gluon") is not None


def _on_h100(monkeypatch):
    monkeypatch.setattr(gluon_ops, "_capable", lambda index: True)
    monkeypatch.setattr(gluon_ops, "_kernel", lambda: object())


@pytest.mark.parametrize("rows, cols, bm, per_sm", [(28672, 4096, 32, 8), (28672, 4096, 64, 8), (4096, 14336, 32, 4),
                                                     (4096, 14336, 64, 4), (14336, 8192, 64, 8)])
def test_rules_take_the_measured_shapes(monkeypatch, rows, cols, bm, per_sm):
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON", raising=False)
    _on_h100(monkeypatch)
    rule = gluon_ops.gluon_rule("Q4_K", rows, cols, bm, torch.device("cuda", 0))
    assert rule is not None and dict(rule.launch)["programs_per_sm"] == per_sm


@pytest.mark.parametrize("name, rows, cols, bm", [("Q4_K", 4096, 4096, 32), ("Q4_K", 4096, 4096, 64),
                                                  ("Q4_K", 2048, 8192, 32), ("Q4_K", 16384, 2048, 64),
                                                  ("Q6_K", 4096, 14336, 32), ("Q4_0", 28672, 4096, 64),
                                                  ("Q4_K", 28672, 4096, 16)])
def test_rules_leave_other_calls_to_the_triton_kernel(monkeypatch, name, rows, cols, bm):
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON", raising=False)
    _on_h100(monkeypatch)
    assert gluon_ops.gluon_rule(name, rows, cols, bm, torch.device("cuda", 0)) is None


def test_off_the_h100_off_by_setting_or_on_the_cpu(monkeypatch):
    _on_h100(monkeypatch)
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON", "0")
    assert gluon_ops.gluon_rule("Q4_K", 28672, 4096, 32, torch.device("cuda", 0)) is None
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON")
    assert gluon_ops.gluon_rule("Q4_K", 28672, 4096, 32, torch.device("cpu")) is None
    monkeypatch.setattr(gluon_ops, "_capable", lambda index: False)  # an A100 or a B200: no wgmma
    assert gluon_ops.gluon_rule("Q4_K", 28672, 4096, 32, torch.device("cuda", 0)) is None
    monkeypatch.setattr(gluon_ops, "_capable", lambda index: True)
    monkeypatch.setattr(gluon_ops, "_kernel", lambda: None)  # a Triton without Gluon
    assert gluon_ops.gluon_rule("Q4_K", 28672, 4096, 32, torch.device("cuda", 0)) is None


SCRIPT = textwrap.dedent("""
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from toolkit.kernels.gguf.gluon_dot16 import gluon_q4k_kernel

    cases = {}
    for bm in (32, 64):
        constexprs = {"BM": bm, "BN": 64, "STAGES": 2, "num_warps": 4, "PDL": True}
        signature = {name: "constexpr" if name in constexprs else "*bf16" if name == "x_ptr" else "*fp32"
                     if name == "out_ptr" else "*u8" if name == "w_ptr" else "i32"
                     for name in gluon_q4k_kernel.arg_names}
        aligned = {(gluon_q4k_kernel.arg_names.index(name),): [["tt.divisibility", 16]]
                   for name in ("x_ptr", "w_ptr", "out_ptr", "stride_x", "row_bytes", "K", "K_SPLIT", "N")}
        kernel = triton.compile(GluonASTSource(gluon_q4k_kernel, signature, constexprs, aligned),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "launch_pdl": True})
        cases[bm] = {"ptx": kernel.asm["ptx"], "shared": kernel.metadata.shared}
    print(json.dumps(cases))
""")


def _loop(ptx: str) -> list[str]:
    """The lines of the longest labelled region that branches back to its own label: the K loop."""
    lines, best = [line.strip() for line in ptx.splitlines()], []
    for start, line in enumerate(lines):
        label = re.match(r"(\$L__BB\d+_\d+):", line)
        if label:
            back = re.compile(r"\bbra(\.uni)?\s+" + re.escape(label.group(1)) + ";")
            end = next((i for i in range(start + 1, len(lines)) if back.search(lines[i])), None)
            if end is not None and end - start > len(best):
                best = lines[start:end + 1]
    return best


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
def test_compiled_for_sm90_the_mma_stays_in_flight_while_the_next_tile_is_decoded():
    """What the kernel is for, in the code ptxas receives: inside the K loop every wait leaves one MMA in flight
    (``wgmma.wait_group 1``, never 0), with the decoding (byte permutes, fused multiply-adds) between an MMA's issue
    and its wait; and the PDL contract (``triton_pdl``): weights are loaded before ``griddepcontrol.wait``, nothing
    is stored before it, and the next kernel is not let in early."""
    cases = compile_in_fresh_process(SCRIPT)
    for bm, case in cases.items():
        loop = _loop(case["ptx"])
        waits = [line for line in loop if line.startswith("wgmma.wait_group")]
        assert sum(line.startswith("wgmma.mma_async") for line in loop) >= 8, bm
        assert waits and all(line.endswith(" 1;") for line in waits), (bm, waits)
        # with every wait leaving one MMA in flight, the decoding between two MMA issues runs beside the first MMA:
        # at least the 8 sub-blocks' tiles of a super-block are decoded between issues (byte permutes, in the
        # inline assembly of the decode, and fused multiply-adds)
        issues = [i for i, line in enumerate(loop) if line.startswith("wgmma.mma_async")]
        decoded_between = sum(any("prmt.b32" in line or line.startswith("fma.rn.f32") for line in loop[a:b])
                              for a, b in zip(issues, issues[1:]))
        assert decoded_between >= 7, (bm, decoded_between)
        assert case["shared"] == 2 * 8 * int(bm) * 32 * 2, case["shared"]  # two super-blocks of bf16 activations
        lines = case["ptx"].splitlines()
        gdc = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
        assert any("ld.global" in line for line in lines[:gdc]), "weights load after the wait"
        assert not any(("st.global" in line or "cp.async" in line) for line in lines[:gdc]), "x read or out written"
        assert not any("griddepcontrol.launch_dependents" in line for line in lines)


def _h100() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAS_GLUON


def _q4k(rows: int, cols: int, rng) -> np.ndarray:
    size, nbytes = GGML_QUANT_SIZES[Q4_K]
    blocks = rng.integers(0, 256, (rows * cols // size, nbytes), dtype=np.uint8)
    for offset in (0, 2):  # d and dmin: small finite fp16
        blocks[:, offset:offset + 2] = rng.uniform(-0.02, 0.02, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.gpu
@pytest.mark.skipif(not _h100(), reason="needs an H100/H200 (sm_90) and Triton with Gluon")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_within_weight_rounding_of_gguf_py(dtype):
    """Against float64 on gguf-py's dequantization: each weight rounded once to x's dtype, float32 sums. Rows and
    tokens off the tile sizes, K split and not, launches other than the rules'; and the dispatch sends a shape the
    rules take to it (``gguf_matmul`` gives the same bits as this kernel)."""
    from toolkit.kernels.gguf import triton_ops
    eps = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -10
    rng = np.random.default_rng(5)
    for rows, cols in ((1000, 2048), (37, 512), (8200, 4096)):
        packed = _q4k(rows, cols, rng)
        weight = torch.from_numpy(dequantize(packed, Q4_K).astype(np.float64)).cuda()
        data = torch.from_numpy(packed).cuda()
        for tokens in (17, 40, 64):
            x = torch.randn(tokens, cols, device="cuda").to(dtype)
            exact = x.double() @ weight.T
            bound = eps * (x.double().abs() @ weight.abs().T + exact.abs())
            bm = 32 if tokens <= 32 else 64
            for split, stages in ((1, 2), (None, 2), (2, 3)):
                got = gluon_ops.gluon_matmul(x, data, cols, bm, split=split, stages=stages)
                assert got.shape == (tokens, rows) and got.dtype == dtype
                assert ((got.double() - exact).abs() <= bound).all(), (rows, cols, tokens, split, stages)
    data = torch.from_numpy(_q4k(8192, 4096, rng)).cuda()
    x = torch.randn(40, 4096, device="cuda").to(dtype)
    rule = gluon_ops.gluon_rule("Q4_K", 8192, 4096, 64, x.device)
    assert rule is not None
    assert torch.equal(triton_ops.gguf_matmul(x, data, int(Q4_K), 4096), gluon_ops.gluon_matmul(x, data, 4096, 64, rule))
