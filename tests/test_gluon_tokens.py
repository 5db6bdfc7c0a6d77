"""The 2-8-token Q4_0 GEMV on int8 tensor cores (``kernels/gguf/gluon_tokens_q4_0``, host side ``gluon_tokens_ops``):
which calls it takes, its compiled form for an H100 (no GPU needed), and its numbers against gguf-py's dequantization
(on an H100/H200 only: no interpreter runs Gluon)."""
from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from toolkit.kernels.gguf import gluon_tokens_ops
from triton_interpreter import compile_in_fresh_process, ptx_loop

from test_gluon_gemv import HAS_GLUON, _h100, _packed  # the one-token GEMV's tests: the same checks of the machine


@pytest.mark.parametrize("name, rows, cols, tokens, unreduced, taken", [
    ("Q4_0", 16384, 2048, 2, False, True), ("Q4_0", 8192, 256, 8, False, True), ("Q4_0", 4096, 4096, 4, False, False),
    ("Q4_0", 4096, 14336, 4, False, True), ("Q4_0", 4096, 14336, 3, False, False),
    ("Q4_0", 2048, 8192, 5, False, True), ("Q4_0", 2048, 8192, 4, False, False), ("Q4_0", 2048, 8192, 4, True, True),
    ("Q4_0", 3072, 2048, 8, False, False), ("Q4_0", 3072, 2048, 8, True, True), ("Q4_0", 2048, 2048, 4, True, False),
    ("Q4_0", 16384, 2048, 1, False, False), ("Q4_0", 16384, 2048, 9, False, False),
    ("Q4_0", 16384, 2080, 8, False, False), ("Q4_K", 16384, 2048, 8, False, False),
    ("Q8_0", 16384, 2048, 8, False, False)])
def test_taken_by_shape_and_tokens(monkeypatch, name, rows, cols, tokens, unreduced, taken):
    """Q4_0 only, 2-8 tokens (one token has its own GEMV; 9 and more the tensor-core matmuls), rows of whole groups of
    eight blocks (256 columns: 16-byte-aligned rows), where session 27's sweeps had it ahead (``RULES``): from 8,192
    rows at any count, from 16M weights at 5 tokens and from 32M at 4, and where the caller takes split-K partial sums
    (an o or down projection) from 5 tokens, or 4 at 16M weights."""
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_TOKENS", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_TOKENS_LAUNCH", raising=False)
    monkeypatch.setattr(gluon_tokens_ops, "_runs_on", lambda device, kernels=None: True)
    launch = gluon_tokens_ops.tokens_launch(name, _packed(name, rows, cols), cols, tokens, unreduced)
    assert (launch == gluon_tokens_ops.LAUNCH) if taken else launch is None


def test_not_taken_off_the_gpu_turned_off_or_unaligned(monkeypatch):
    data = _packed("Q4_0", 8192, 2048)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_TOKENS", raising=False)
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_TOKENS_LAUNCH", raising=False)
    assert gluon_tokens_ops.tokens_launch("Q4_0", data, 2048, 8) is None                    # a CPU tensor
    monkeypatch.setattr(gluon_tokens_ops, "_runs_on", lambda device, kernels=None: True)
    assert gluon_tokens_ops.tokens_launch("Q4_0", data, 2048, 8) is not None
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON_TOKENS", "0")
    assert gluon_tokens_ops.tokens_launch("Q4_0", data, 2048, 8) is None
    monkeypatch.delenv("TOOLKIT_GGUF_GLUON_TOKENS")
    flat = torch.zeros(8192 * 1152 + 2, dtype=torch.uint8)
    assert gluon_tokens_ops.tokens_launch("Q4_0", flat[2:].view(8192, 1152), 2048, 8) is None
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON_TOKENS_LAUNCH", "2,16")                  # benchmarks: every call
    assert gluon_tokens_ops.tokens_launch("Q4_0", _packed("Q4_0", 64, 2048), 2048, 2) == (2, 16)


SCRIPT = textwrap.dedent("""
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from toolkit.kernels.gguf.gluon_tokens_q4_0 import gluon_tokens_q4_0_kernel as kernel

    cases = {}
    for tiles in (1, 2):
        constexprs = {"TILES": tiles, "PDL": True}
        signature = {arg: "constexpr" if arg in constexprs else "*i32" if arg == "xq_ptr" else "*u8"
                     if arg == "w_ptr" else "*bf16" if arg == "out_ptr" else "*fp32" if arg.endswith("_ptr")
                     else "i32" for arg in kernel.arg_names}
        aligned = {(kernel.arg_names.index(arg),): [["tt.divisibility", 16]] for arg in kernel.arg_names
                   if arg.endswith("_ptr") or arg in ("row_bytes", "K_SPLIT", "x_stride", "xd_stride")}
        compiled = triton.compile(GluonASTSource(kernel, signature, constexprs, aligned),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 1, "launch_pdl": True})
        cases[tiles] = compiled.asm["ptx"]
    print(json.dumps(cases))
""")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GLUON, reason="Triton with Gluon is not installed")
def test_compiled_for_sm90_one_mma_per_block_from_16_byte_loads():
    """What the kernel is for, in the code ptxas receives: per step (a group of eight blocks) a thread loads each of
    its two rows per tile as three 16-byte vectors and no narrower weight bytes (its activations' scales as four more,
    once for all tiles), the tile's quant words reach the MMA
    through shared memory as ``ldmatrix`` (the fragment's transpose), and one int8 ``mma.sync`` serves a block of 16
    rows for every token: eight per tile; no int-to-float conversion in the loop (the accumulator's float bias);
    nothing stored before the PDL wait."""
    for tiles, ptx in compile_in_fresh_process(SCRIPT).items():
        tiles = int(tiles)
        loop = ptx_loop(ptx)
        text = "\n".join(loop)
        # three per row of each tile, the activations' scales (two tokens x eight blocks per lane) once
        assert len(re.findall(r"ld\.global\.v4\.b32", text)) == 3 * 2 * tiles + 4, tiles
        assert text.count("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32") == 8 * tiles, tiles
        assert text.count("ldmatrix") >= 2 * tiles, tiles
        assert "cvt.rn.f32.s32" not in text, tiles
        lines = ptx.splitlines()
        wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
        assert not any("st.global" in line for line in lines[:wait])


@pytest.mark.gpu
@pytest.mark.skipif(not _h100(), reason="needs an H100/H200 (sm_90) and Triton with Gluon")
@pytest.mark.parametrize("tokens", [2, 3, 5, 8])
def test_within_activation_rounding_of_gguf_py(tokens):
    """Random Q4_0 weights (fp16 scales in +-0.02, random quant bytes) at rows off the program size, K split and not,
    one and two tiles per program: against float64 on gguf-py's dequantization, within what rounding x to int8 blocks
    of 32 can move the result (the bound of the Triton GEMV's test); then the dispatch: where ``RULES`` take the call,
    ``gguf_matmul`` gives this kernel's bits."""
    from test_gguf_kernels import activation_rounding_bound
    from toolkit.kernels.gguf import dp4a_ops, triton_ops
    qtype, rng = GGMLQuantizationType.Q4_0, np.random.default_rng(11 + tokens)
    for rows, cols in ((37, 256), (130, 2048), (1000, 4096), (2048, 8192), (8200, 2048)):
        blocks = rng.integers(0, 256, (rows * cols // 32, 18), dtype=np.uint8)
        blocks[:, :2] = rng.uniform(-0.02, 0.02, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
        packed = blocks.reshape(rows, -1)
        weight = torch.from_numpy(dequantize(packed, qtype).astype(np.float64)).cuda()
        data = torch.from_numpy(packed).cuda()
        x = torch.randn(tokens, cols, device="cuda").to(torch.bfloat16)
        exact = x.double() @ weight.T
        bound = 3 * 2 ** -8 * (x.double().abs() @ weight.abs().T) + activation_rounding_bound(x, weight)
        words, scales = dp4a_ops.quantize_activations(x)
        for launch in ((1, 8), (2, 16), (1, 1)):
            got = gluon_tokens_ops.gluon_tokens(words, scales, data, cols, x, launch)
            assert got.shape == (tokens, rows) and got.dtype == torch.bfloat16
            assert ((got.double() - exact).abs() <= bound).all(), (rows, cols, launch)
        chosen = gluon_tokens_ops.tokens_launch("Q4_0", data, cols, tokens)
        big = rows * cols >= 1 << 24 if tokens >= 5 else rows * cols >= 1 << 25 if tokens == 4 else False
        assert (chosen is not None) == (rows >= 8192 or big), (rows, cols)
        if chosen is not None:
            assert torch.equal(triton_ops.gguf_matmul(x, data, int(qtype), cols),
                               gluon_tokens_ops.gluon_tokens(words, scales, data, cols, x, chosen))
