"""The bitsandbytes Triton kernels on CUDA (skipped without a GPU), against bitsandbytes' own CUDA
``dequantize_4bit`` / ``int8_vectorwise_dequant`` followed by a float32 matmul, and their dispatch:
the runtime picks them for 1..16 bf16/fp16 tokens and leaves the rest to bitsandbytes.
"""
from __future__ import annotations

import pytest
import torch

from toolkit.kernels import runtime

pytestmark = pytest.mark.gpu
bnb_functional = pytest.importorskip("bitsandbytes.functional")
ops = pytest.importorskip("toolkit.kernels.bnb.triton_ops")
ROWS, COLS = 320, 1024  # 320 rows: a partial last row tile at BN=64
TOKENS = (1, 2, 8, 16)
FMA_CONFIG = ops.MatmulConfig(8, 4, 256, dot=False)


@pytest.fixture(autouse=True)
def fourbit_kernel_on(monkeypatch):
    """The 4-bit kernels take every small batch for these tests (by default only one-token calls)."""
    monkeypatch.setenv("TOOLKIT_BNB_TRITON_4BIT", "1")
    runtime.invalidate()
    yield
    runtime.invalidate()


def test_4bit_kernels_by_default(monkeypatch):
    """Unset, one-token calls take the token-unrolled GEMV and 2..16 tokens the tensor-core kernel
    (``fourbit_kernel``); ``TOOLKIT_BNB_MMA=0`` leaves 2..16 tokens to bitsandbytes, ``TOOLKIT_BNB_TRITON_4BIT=0``
    every call."""
    monkeypatch.delenv("TOOLKIT_BNB_TRITON_4BIT")
    runtime.invalidate()
    weight = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    packed, state = bnb_functional.quantize_4bit(weight, quant_type="nf4")
    one = torch.randn(1, COLS, device="cuda", dtype=torch.bfloat16)
    eight = torch.randn(8, COLS, device="cuda", dtype=torch.bfloat16)
    assert (ops.fourbit_kernel(1), ops.fourbit_kernel(8)) == ("tokens", "mma")
    assert runtime.resolve("bnb_4bit_matmul", one, packed.view(-1), state, None) is ops.bnb_4bit_matmul
    assert runtime.resolve("bnb_4bit_matmul", eight, packed.view(-1), state, None) is ops.bnb_4bit_matmul
    monkeypatch.setenv("TOOLKIT_BNB_MMA", "0")
    runtime.invalidate()
    assert runtime.resolve("bnb_4bit_matmul", eight, packed.view(-1), state, None) is not ops.bnb_4bit_matmul
    monkeypatch.setenv("TOOLKIT_BNB_TRITON_4BIT", "0")
    runtime.invalidate()
    assert runtime.resolve("bnb_4bit_matmul", one, packed.view(-1), state, None) is not ops.bnb_4bit_matmul


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Within the output dtype's rounding (float32 accumulation inside; the reference is float32)."""
    eps = 2 ** -7 if got.dtype == torch.bfloat16 else 2 ** -9
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=expected.abs().max().item() * eps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("quant_type,nested", [("nf4", False), ("nf4", True), ("fp4", False), ("fp4", True)])
def test_4bit_kernel_matches_bitsandbytes(quant_type, nested, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(ROWS, COLS, device="cuda", generator=g, dtype=dtype)
    packed, state = bnb_functional.quantize_4bit(weight, blocksize=64, quant_type=quant_type,
                                                 compress_statistics=nested)
    dense = bnb_functional.dequantize_4bit(packed, state).to(dtype).float()
    for tokens in TOKENS:
        x = torch.randn(tokens, COLS, device="cuda", generator=g, dtype=dtype)
        args = (x, packed.view(-1), state, None)
        assert runtime.resolve("bnb_4bit_matmul", *args) is ops.bnb_4bit_matmul
        _close(runtime.call("bnb_4bit_matmul", *args), x.float() @ dense.T)
        if tokens <= 8:  # the multiply-accumulate alternative (bench sweep) compiles and agrees
            _close(ops.fourbit_matmul(x, packed.view(-1), state, FMA_CONFIG), x.float() @ dense.T)


def test_4bit_dispatch_leaves_larger_batches_and_float32_to_bitsandbytes():
    weight = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    packed, state = bnb_functional.quantize_4bit(weight, quant_type="nf4")
    for x in (torch.randn(17, COLS, device="cuda", dtype=torch.bfloat16), torch.randn(4, COLS, device="cuda")):
        assert runtime.resolve("bnb_4bit_matmul", x, packed.view(-1), state, None) is not ops.bnb_4bit_matmul


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_kernel_matches_bitsandbytes(dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    weight = torch.randn(ROWS, COLS, device="cuda", generator=g, dtype=torch.float16)
    weight[:, 7] *= 50  # an outlier column: computed in float like every other one
    data, scb, _ = bnb_functional.int8_vectorwise_quant(weight)
    dense = bnb_functional.int8_vectorwise_dequant(data, scb).float()
    for tokens in TOKENS:
        x = torch.randn(tokens, COLS, device="cuda", generator=g, dtype=dtype)
        for threshold in (0.0, 6.0):
            args = (x, data, scb, threshold, None)
            assert runtime.resolve("bnb_int8_matmul", *args) is ops.bnb_int8_matmul
            _close(runtime.call("bnb_int8_matmul", *args), x.float() @ dense.T)
        if tokens <= 8:
            _close(ops.int8_matmul(x, data, scb, FMA_CONFIG), x.float() @ dense.T)
    big = torch.randn(17, COLS, device="cuda", dtype=dtype)
    assert runtime.resolve("bnb_int8_matmul", big, data, scb, 6.0, None) is not ops.bnb_int8_matmul


@pytest.mark.parametrize("dispatch", ["token kernels", "default"])
@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_kernels_are_captured_in_a_cuda_graph(kind, dispatch, monkeypatch):
    """No host synchronisation: the kernels replay in a graph and give the eager result, with every 4-bit call
    on the token GEMV and with the default dispatch (8 tokens: the tensor-core kernels, whose codebook decoder
    is built by the call before capture, as the engine's warm-up step does)."""
    if dispatch == "default":
        monkeypatch.delenv("TOOLKIT_BNB_TRITON_4BIT")
        runtime.invalidate()
    weight = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    if kind == "nf4":
        packed, state = bnb_functional.quantize_4bit(weight, quant_type="nf4", compress_statistics=True)
        op, args = "bnb_4bit_matmul", (packed.view(-1), state, None)
    else:
        data, scb, _ = bnb_functional.int8_vectorwise_quant(weight.half())
        op, args = "bnb_int8_matmul", (data, scb, 6.0, None)
    x = torch.randn(8, COLS, device="cuda", dtype=torch.bfloat16)
    eager = runtime.call(op, x, *args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = runtime.call(op, x, *args)
    x.copy_(torch.randn_like(x))
    eager = runtime.call(op, x, *args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


# ---- the token-unrolled GEMVs (triton_gemv_tokens) ------------------------------------------------
ALL_TOKENS = (1, 2, 3, 4, 8, 16)


@pytest.mark.parametrize("lut", [16, 256])
@pytest.mark.parametrize("quant_type,nested", [("nf4", False), ("nf4", True), ("fp4", False), ("fp4", True)])
def test_4bit_tokens_kernel_matches_bitsandbytes(quant_type, nested, lut):
    g = torch.Generator(device="cuda").manual_seed(2)
    weight = torch.randn(ROWS, COLS, device="cuda", generator=g, dtype=torch.bfloat16)
    packed, state = bnb_functional.quantize_4bit(weight, blocksize=64, quant_type=quant_type,
                                                 compress_statistics=nested)
    dense = bnb_functional.dequantize_4bit(packed, state).float()
    for tokens in ALL_TOKENS:
        x = torch.randn(tokens, COLS, device="cuda", generator=g, dtype=torch.bfloat16)
        for split in (None, 1):  # automatic (K split across SMs at 320 rows) and none
            config = ops.TokensConfig(bn=4, bk=1024, lut=lut)
            _close(ops.fourbit_tokens_matmul(x, packed.view(-1), state, config, split=split), x.float() @ dense.T)


def _fused_segments(nested: bool, rows=(256, 64, 64)):
    """q/k/v-like segments quantized on their own, statistics gathered as the bnb scheme lays them out."""
    from toolkit.plugins.quant.bnb.params4 import gather_states
    g = torch.Generator(device="cuda").manual_seed(3)
    parts = [bnb_functional.quantize_4bit(torch.randn(n, COLS, device="cuda", generator=g, dtype=torch.bfloat16),
                                          quant_type="nf4", compress_statistics=nested) for n in rows]
    dense = torch.cat([bnb_functional.dequantize_4bit(p, s) for p, s in parts]).float()
    states = [state for _, state in parts]
    assert gather_states(states)
    regathered = torch.cat([bnb_functional.dequantize_4bit(p, s) for p, s in parts]).float()
    assert torch.equal(regathered, dense)  # bitsandbytes reads the gathered views as before
    return torch.cat([p.view(-1) for p, _ in parts]), states, dense


@pytest.mark.parametrize("nested", [False, True])
def test_4bit_fused_segments_run_in_one_launch(nested):
    packed, states, dense = _fused_segments(nested, rows=(200, 60, 60))  # row tiles straddle segments
    for tokens in ALL_TOKENS:
        x = torch.randn(tokens, COLS, device="cuda", dtype=torch.bfloat16)
        args = (x, packed, states, None)
        assert runtime.resolve("bnb_4bit_matmul_segments", *args) is ops.bnb_4bit_matmul_segments
        _close(runtime.call("bnb_4bit_matmul_segments", *args), x.float() @ dense.T)
        for lut in (16, 256):
            _close(ops.fourbit_tokens_matmul(x, packed, states, ops.TokensConfig(bn=8, bk=512, lut=lut)),
                   x.float() @ dense.T)


def test_4bit_segments_not_gathered_go_one_by_one():
    g = torch.Generator(device="cuda").manual_seed(4)
    parts = [bnb_functional.quantize_4bit(torch.randn(64, COLS, device="cuda", generator=g, dtype=torch.bfloat16),
                                          quant_type="nf4") for _ in range(2)]
    x = torch.randn(2, COLS, device="cuda", dtype=torch.bfloat16)
    args = (x, torch.cat([p.view(-1) for p, _ in parts]), [s for _, s in parts], None)
    assert runtime.resolve("bnb_4bit_matmul_segments", *args) is not ops.bnb_4bit_matmul_segments
    dense = torch.cat([bnb_functional.dequantize_4bit(p, s) for p, s in parts]).float()
    _close(runtime.call("bnb_4bit_matmul_segments", *args), x.float() @ dense.T)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_tokens_kernel_matches_bitsandbytes(dtype):
    g = torch.Generator(device="cuda").manual_seed(5)
    weight = torch.randn(ROWS, COLS, device="cuda", generator=g, dtype=torch.float16)
    weight[:, 9] *= 50
    data, scb, _ = bnb_functional.int8_vectorwise_quant(weight)
    dense = bnb_functional.int8_vectorwise_dequant(data, scb).float()
    for tokens in ALL_TOKENS:
        x = torch.randn(tokens, COLS, device="cuda", generator=g, dtype=dtype)
        for split in (None, 1):
            _close(ops.int8_tokens_matmul(x, data, scb, ops.TokensConfig(bn=4, bk=1024), split=split),
                   x.float() @ dense.T)


@pytest.mark.parametrize("lut", [16, 256])
def test_fused_segments_are_captured_in_a_cuda_graph(lut, monkeypatch):
    packed, states, _ = _fused_segments(True)
    config = ops.TokensConfig(bn=4, bk=1024, lut=lut)
    monkeypatch.setattr(ops, "FOURBIT_TOKENS_CONFIG", ((16, config),))
    x = torch.randn(8, COLS, device="cuda", dtype=torch.bfloat16)
    args = (x, packed, states, None)
    runtime.call("bnb_4bit_matmul_segments", *args)  # builds the byte table before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = runtime.call("bnb_4bit_matmul_segments", *args)
    x.copy_(torch.randn_like(x))
    eager = runtime.call("bnb_4bit_matmul_segments", *args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
