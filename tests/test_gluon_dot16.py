"""The Gluon GGUF kernels (``kernels/gguf/gluon_q4_k``, ``gluon_q6_k``, ``gluon_q4_0`` on ``gluon_pipeline``; host
side ``gluon_ops``): which calls they take, their compiled form for an H100 (no GPU needed), and their numbers
against gguf-py's dequantization (on an H100/H200 only: no interpreter runs Gluon)."""
from __future__ import annotations

import importlib.util
import textwrap

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from toolkit.kernels.gguf import gluon_ops
from triton_interpreter import compile_in_fresh_process, ptx_loop

HAS_GLUON = importlib.util.find_spec("triton") is not None and \
    importlib.util.find_spec("triton.experimental.gluon") is not None


def _on_h100(monkeypatch):
    monkeypatch.setattr(gluon_ops, "_capable", lambda index: True)
    monkeypatch.setattr(gluon_ops, "_kernels", lambda: {})


@pytest.mark.parametrize("name, rows, cols, bm, per_sm", [
    ("Q4_K", 28672, 4096, 32, 8), ("Q4_K", 28672, 4096, 64, 8), ("Q4_K", 4096, 14336, 32, 4),
    ("Q4_K", 4096, 14336, 64, 4), ("Q4_K", 14336, 8192, 64, 8), ("Q6_K", 4096, 14336, 32, 4),
    ("Q6_K", 128256, 4096, 64, 4), ("Q6_K", 512, 2048, 32, 4), ("Q4_0", 16384, 2048, 32, 4),
    ("Q4_0", 2048, 2048, 64, 4)])
def test_rules_take_the_measured_shapes(monkeypatch, name, rows, cols, bm, per_sm):
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_DOT16_LAUNCH", raising=False)
    _on_h100(monkeypatch)
    rule = gluon_ops.gluon_rule(name, rows, cols, bm, torch.device("cuda", 0))
    assert rule is not None
    assert {**gluon_ops.GLUON_LAUNCH, **dict(rule.launch)}["programs_per_sm"] == per_sm
    if name == "Q4_0":  # three stages of activations at 33-64 tokens
        assert {**gluon_ops.GLUON_LAUNCH, **dict(rule.launch)}["stages"] == (3 if bm == 64 else 2)


@pytest.mark.parametrize("name, tokens, taken", [("Q4_K", 8, True), ("Q6_K", 16, True), ("Q4_0", 9, True),
                                                  ("Q4_0", 8, False), ("Q4_K", 7, False), ("Q6_K", 1, False),
                                                  ("Q8_0", 12, False), ("Q4_K", 17, True), ("Q8_0", 17, True)])
def test_below_17_tokens_the_16_bit_path_takes_only_what_gluon_serves(monkeypatch, name, tokens, taken):
    """``dot16_takes`` below the Triton kernel's 17 tokens: the calls of ``GLUON_RULES``' 16-token tiles, which then
    skip the int8 kernels (and the int8 activation blocks the norms would write for them)."""
    from toolkit.kernels.gguf import dot16_ops
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_DOT16", raising=False)
    monkeypatch.setattr(gluon_ops, "_runs_on", lambda device: True)
    qtype = int(GGMLQuantizationType[name])
    size, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    data = torch.zeros(4096, 4096 // size * nbytes, dtype=torch.uint8)
    assert dot16_ops.dot16_takes(data, qtype, 4096, tokens) is taken
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16", "0")
    assert not dot16_ops.dot16_takes(data, qtype, 4096, tokens)


@pytest.mark.parametrize("name, rows, cols, bm", [("Q4_K", 4096, 4096, 32), ("Q4_K", 4096, 4096, 64),
                                                  ("Q4_K", 2048, 8192, 32), ("Q4_K", 16384, 2048, 64),
                                                  ("Q8_0", 4096, 14336, 32), ("Q5_K", 28672, 4096, 64),
                                                  ("Q4_K", 28672, 4096, 16), ("Q6_K", 4096, 14336, 16)])
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
    monkeypatch.setattr(gluon_ops, "_kernels", lambda: None)  # a Triton without Gluon
    assert gluon_ops.gluon_rule("Q4_K", 28672, 4096, 32, torch.device("cuda", 0)) is None
    monkeypatch.setattr(gluon_ops, "_kernels", lambda: {})
    monkeypatch.setenv("TOOLKIT_GGUF_DOT16_LAUNCH", "64,4,2,4,0")  # timing the Triton kernel
    assert gluon_ops.gluon_rule("Q4_K", 28672, 4096, 32, torch.device("cuda", 0)) is None


SCRIPT = textwrap.dedent("""
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from toolkit.kernels.gguf.gluon_q4_0 import gluon_q40_kernel
    from toolkit.kernels.gguf.gluon_q4_k import gluon_q4k_kernel
    from toolkit.kernels.gguf.gluon_q6_k import gluon_q6k_kernel

    cases = {}
    for name, kernel, extra, options in (("Q4_K", gluon_q4k_kernel, {}, {}), ("Q6_K", gluon_q6k_kernel, {}, {}),
                                         ("Q4_0", gluon_q40_kernel, {"GROUP": 4}, {})):
        for bm in (16, 32, 64):
            constexprs = {"BM": bm, "BN": 64, "STAGES": 2, "num_warps": 4, "PDL": True, **extra}
            signature = {arg: "constexpr" if arg in constexprs else "*bf16" if arg == "x_ptr" else "*fp32"
                         if arg == "out_ptr" else "*u8" if arg == "w_ptr" else "i32" for arg in kernel.arg_names}
            aligned = {(kernel.arg_names.index(arg),): [["tt.divisibility", 16]]
                       for arg in ("x_ptr", "w_ptr", "out_ptr", "stride_x", "row_bytes", "K", "K_SPLIT", "N")}
            compiled = triton.compile(GluonASTSource(kernel, signature, constexprs, aligned),
                                      target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": 4, "launch_pdl": True, **options})
            cases[f"{name} {bm}"] = {"ptx": compiled.asm["ptx"], "shared": compiled.metadata.shared,
                                     "pieces": 4 if name == "Q4_0" else 8, "bm": bm}
    print(json.dumps(cases))
""")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
def test_compiled_for_sm90_each_mma_stays_in_flight_while_the_next_tile_is_decoded():
    """What the kernel is for, in the code ptxas receives: inside the K loop every wait leaves one MMA in flight
    (``wgmma.wait_group 1``, never 0), with the decoding (byte permutes, fused multiply-adds) between an MMA's issue
    and its wait; and the PDL contract (``triton_pdl``): weights are loaded before ``griddepcontrol.wait``, nothing
    is stored before it, and the next kernel is not let in early."""
    cases = compile_in_fresh_process(SCRIPT)
    assert len(cases) == 9
    for bm, case in cases.items():
        loop = ptx_loop(case["ptx"])
        waits = [line for line in loop if line.startswith("wgmma.wait_group")]
        assert sum(line.startswith("wgmma.mma_async") for line in loop) >= 8, bm
        assert waits and all(line.endswith(" 1;") for line in waits), (bm, waits)
        # with every wait leaving one MMA in flight, the decoding between two MMA issues runs beside the first MMA:
        # at least the 8 sub-blocks' tiles of a super-block are decoded between issues (byte permutes, in the
        # inline assembly of the decode, and fused multiply-adds)
        issues = [i for i, line in enumerate(loop) if line.startswith("wgmma.mma_async")]
        decoded_between = sum(any("prmt.b32" in line or line.startswith("fma.rn.f32") for line in loop[a:b])
                              for a, b in zip(issues, issues[1:]))
        assert decoded_between >= case["pieces"] - 1, (bm, decoded_between)
        # two units (super-blocks, or groups of 4 Q4_0 blocks) of bf16 activations
        assert case["shared"] == 2 * case["pieces"] * case["bm"] * 32 * 2, (bm, case["shared"])
        lines = case["ptx"].splitlines()
        gdc = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
        assert any("ld.global" in line for line in lines[:gdc]), "weights load after the wait"
        assert not any(("st.global" in line or "cp.async" in line) for line in lines[:gdc]), "x read or out written"
        assert not any("griddepcontrol.launch_dependents" in line for line in lines)


def _h100() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAS_GLUON


# byte offsets of each type's fp16 scales in its block (kept small and finite in random blocks)
FP16_SCALES = {"Q4_K": (0, 2), "Q6_K": (208,), "Q4_0": (0,)}


def _random_blocks(name: str, rows: int, cols: int, rng) -> np.ndarray:
    qtype = GGMLQuantizationType[name]
    size, nbytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // size, nbytes), dtype=np.uint8)
    for offset in FP16_SCALES[name]:
        blocks[:, offset:offset + 2] = rng.uniform(-0.02, 0.02, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.gpu
@pytest.mark.skipif(not _h100(), reason="needs an H100/H200 (sm_90) and Triton with Gluon")
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q4_0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_within_weight_rounding_of_gguf_py(name, dtype):
    """Against float64 on gguf-py's dequantization: each weight rounded once to x's dtype, float32 sums. Rows and
    tokens off the tile sizes, K split and not, launches other than the rules'; and the dispatch sends a shape the
    rules take to the kernel (``gguf_matmul`` gives the same bits)."""
    from toolkit.kernels.gguf import triton_ops
    eps = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -10
    qtype = int(GGMLQuantizationType[name])
    rng = np.random.default_rng(5)
    for rows, cols in ((1000, 2048), (37, 512), (8200, 4096)):
        packed = _random_blocks(name, rows, cols, rng)
        weight = torch.from_numpy(dequantize(packed, GGMLQuantizationType[name]).astype(np.float64)).cuda()
        data = torch.from_numpy(packed).cuda()
        for tokens in (8, 13, 17, 40, 64):
            x = torch.randn(tokens, cols, device="cuda").to(dtype)
            exact = x.double() @ weight.T
            bound = eps * (x.double().abs() @ weight.abs().T + exact.abs())
            bm = 16 if tokens <= 16 else 32 if tokens <= 32 else 64
            for split, stages, group in ((1, 2, 4), (None, 2, 2), (2, 3, 8)):
                got = gluon_ops.gluon_matmul(x, data, name, cols, bm, split=split, stages=stages, group=group)
                assert got.shape == (tokens, rows) and got.dtype == dtype
                assert ((got.double() - exact).abs() <= bound).all(), (name, rows, cols, tokens, split, stages)
    data = torch.from_numpy(_random_blocks(name, 8192, 8192, rng)).cuda()
    for tokens, bm in ((12, 16), (40, 64)):
        x = torch.randn(tokens, 8192, device="cuda").to(dtype)
        rule = gluon_ops.gluon_rule(name, 8192, 8192, bm, x.device, tokens)
        assert rule is not None
        dispatched = triton_ops.gguf_matmul(x, data, qtype, 8192)
        assert torch.equal(dispatched, gluon_ops.gluon_matmul(x, data, name, 8192, bm, rule))
