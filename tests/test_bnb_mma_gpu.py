"""The tensor-core bitsandbytes kernels (``toolkit/kernels/bnb/triton_mma.py``, 2..16 tokens) on CUDA, against
bitsandbytes' own CUDA ``dequantize_4bit`` / ``int8_vectorwise_dequant`` and a float32 matmul; the PTX codebook
decoder against the codebook loads it replaces (bit for bit); the default dispatch and fused segments (graph
capture with the default dispatch: tests/test_bnb_triton_gpu.py). Skipped without a GPU.
"""
from __future__ import annotations

import pytest
import torch

from toolkit.kernels import runtime

pytestmark = pytest.mark.gpu
bnb_functional = pytest.importorskip("bitsandbytes.functional")
ops = pytest.importorskip("toolkit.kernels.bnb.triton_ops")
mma = pytest.importorskip("toolkit.kernels.bnb.mma_ops")
ROWS, COLS = 320, 1024  # 320 rows: a partial last row tile at BN=128
TOKENS = (2, 3, 8, 16)
CONFIGS = (mma.MmaConfig(), mma.MmaConfig(bn=128, bk=256, num_stages=3), mma.MmaConfig(bn=64, bk=512, split=1))


@pytest.fixture(autouse=True)
def default_dispatch(monkeypatch):
    for name in ("TOOLKIT_BNB_TRITON_4BIT", "TOOLKIT_BNB_MMA", "TOOLKIT_BNB_TRITON"):
        monkeypatch.delenv(name, raising=False)
    runtime.invalidate()
    yield
    runtime.invalidate()


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Within the output dtype's rounding (float32 sums inside; the codebook value is rounded to the activations'
    dtype where bitsandbytes rounds its product with the absmax: the same relative size)."""
    eps = 2 ** -7 if got.dtype == torch.bfloat16 else 2 ** -9
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=expected.abs().max().item() * eps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("quant_type,nested,blocksize", [("nf4", False, 64), ("nf4", True, 64), ("fp4", False, 64),
                                                          ("fp4", True, 128), ("nf4", True, 256)])
def test_4bit_mma_kernel_matches_bitsandbytes(quant_type, nested, blocksize, dtype):
    g = torch.Generator(device="cuda").manual_seed(blocksize + nested)
    weight = torch.randn(ROWS, COLS, device="cuda", generator=g, dtype=dtype)
    packed, state = bnb_functional.quantize_4bit(weight, blocksize=blocksize, quant_type=quant_type,
                                                 compress_statistics=nested)
    dense = bnb_functional.dequantize_4bit(packed, state).float()
    for tokens in TOKENS:
        x = torch.randn(tokens, COLS, device="cuda", generator=g, dtype=dtype)
        args = (x, packed.view(-1), state, None)
        assert runtime.resolve("bnb_4bit_matmul", *args) is ops.bnb_4bit_matmul
        _close(runtime.call("bnb_4bit_matmul", *args), x.float() @ dense.T)
        for config in CONFIGS:
            _close(mma.fourbit_mma_matmul(x, packed.view(-1), state, config), x.float() @ dense.T)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_decoder_equals_codebook_loads(quant_type, dtype, monkeypatch):
    """The PTX decoder and the codebook loads round the same values to the same dtype, so the sums match
    bit for bit."""
    weight = torch.randn(ROWS, COLS, device="cuda", dtype=dtype)
    packed, state = bnb_functional.quantize_4bit(weight, quant_type=quant_type)
    x = torch.randn(8, COLS, device="cuda", dtype=dtype)
    assert mma._decoder([state], dtype) != ""
    decoded = mma.fourbit_mma_matmul(x, packed.view(-1), state, mma.MmaConfig(split=1))
    monkeypatch.setattr(mma, "_decoder", lambda states, dtype: "")
    loaded = mma.fourbit_mma_matmul(x, packed.view(-1), state, mma.MmaConfig(split=1))
    assert torch.equal(decoded, loaded)


@pytest.mark.parametrize("nested", [False, True])
def test_4bit_mma_fused_segments_in_one_launch(nested):
    from toolkit.plugins.quant.bnb.params4 import gather_states
    g = torch.Generator(device="cuda").manual_seed(7)
    parts = [bnb_functional.quantize_4bit(torch.randn(n, COLS, device="cuda", generator=g, dtype=torch.bfloat16),
                                          quant_type="nf4", compress_statistics=nested) for n in (200, 60, 60)]
    dense = torch.cat([bnb_functional.dequantize_4bit(p, s) for p, s in parts]).float()
    states = [state for _, state in parts]
    assert gather_states(states)
    packed = torch.cat([p.view(-1) for p, _ in parts])
    for tokens in TOKENS:
        x = torch.randn(tokens, COLS, device="cuda", dtype=torch.bfloat16)
        args = (x, packed, states, None)
        assert runtime.resolve("bnb_4bit_matmul_segments", *args) is ops.bnb_4bit_matmul_segments
        _close(runtime.call("bnb_4bit_matmul_segments", *args), x.float() @ dense.T)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_mma_kernel_matches_bitsandbytes(dtype):
    g = torch.Generator(device="cuda").manual_seed(8)
    weight = torch.randn(ROWS, COLS, device="cuda", generator=g, dtype=torch.float16)
    weight[:, 11] *= 50  # an outlier column: weight-only, computed in float like every other one
    data, scb, _ = bnb_functional.int8_vectorwise_quant(weight)
    dense = bnb_functional.int8_vectorwise_dequant(data, scb).float()
    for tokens in TOKENS:
        x = torch.randn(tokens, COLS, device="cuda", generator=g, dtype=dtype)
        _close(runtime.call("bnb_int8_matmul", x, data, scb, 6.0, None), x.float() @ dense.T)
        for config in CONFIGS:
            _close(mma.int8_mma_matmul(x, data, scb, config), x.float() @ dense.T)
