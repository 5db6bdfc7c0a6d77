"""Our torch GGUF quantizers against gguf-py.

* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: byte-identical to ``gguf.quants.quantize`` on the same tensor.
* Q4_K, Q5_K, Q6_K (gguf-py cannot produce them): decoded by ``gguf.quants.dequantize``, every
  element lands where it belongs, and the error is below a plain round-to-nearest quantizer
  of the same format (written here in numpy, independently of the code under test).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from toolkit.core.errors import ShapeMismatchError, UnsupportedQuantTypeError
from toolkit.kernels.gguf_quant import quantize

LEGACY = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
KQUANTS = ["Q4_K", "Q5_K", "Q6_K"]


def awkward(rows: int = 48, cols: int = 1024, seed: int = 0) -> torch.Tensor:
    """Random rows of varied scale plus the cases rounding code gets wrong."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen).mul(3).add(0.01)
    x[0] = 0                                   # all-zero blocks
    x[1] = 0.75                                # constant blocks
    x[2, ::32], x[2, 1::32] = 4.0, -4.0        # equal-magnitude maxima of both signs (argmax ties)
    x[3] *= 1e-30                              # scales that underflow fp16
    x[4] = torch.round(x[4] * 8) / 8           # exact halves after scaling (round-half cases)
    x[5, 7] = 50.0                             # one outlier
    x[6] = x[6].abs()                          # all positive (block min above zero)
    x[7] = -x[7].abs()                         # all negative
    x[8, ::32], x[8, 1::32] = -3.0, 3.0        # ... the negative one first
    x[9] = -0.0                                # negative zeros: the sign of the first one shows in d
    x[10] = 0.0                                # (zeros of both signs: see the test below)
    return x


def qtype(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_types_are_byte_identical_to_gguf_py(name):
    x = awkward()
    ours = quantize(x, name)
    assert ours.dtype == torch.uint8
    np.testing.assert_array_equal(ours.numpy(), gguf_quantize(x.numpy(), qtype(name)))


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_types_from_bfloat16_match_gguf_py_on_the_float32_values(name):
    x = awkward(rows=16, cols=256, seed=1).to(torch.bfloat16)
    np.testing.assert_array_equal(quantize(x, name).numpy(), gguf_quantize(x.float().numpy(), qtype(name)))


@pytest.mark.parametrize("name", LEGACY)
def test_blocks_of_mixed_sign_zeros(name):
    """Which zero numpy's min/max returns depends on its SIMD reduction order, so only the sign of a
    zero min field may differ; everything else, and every decoded value, is identical."""
    x = torch.zeros(4, 64)
    x[:, ::3] = -0.0
    x[1, 40] = 1.0
    ours, theirs = quantize(x, name).numpy(), gguf_quantize(x.numpy(), qtype(name))
    if name in ("Q4_1", "Q5_1"):  # [d (2 bytes), m (2 bytes), ...] per 32-element block
        for block in range(2):
            ours[:, block * (ours.shape[1] // 2) + 3] &= 0x7F
            theirs[:, block * (theirs.shape[1] // 2) + 3] &= 0x7F
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(gguf_dequantize(quantize(x, name).numpy(), qtype(name)),
                                  gguf_dequantize(gguf_quantize(x.numpy(), qtype(name)), qtype(name)))


@pytest.mark.parametrize("name", LEGACY + KQUANTS)
def test_each_element_decodes_at_its_own_position(name):
    """Row r holds a single spike at column r: a wrong nibble, bit or scale order moves or loses it."""
    block = GGML_QUANT_SIZES[qtype(name)][0]
    x = torch.zeros(block, block)
    x[torch.arange(block), torch.arange(block)] = torch.linspace(0.5, 2.0, block)
    decoded = gguf_dequantize(quantize(x, name).numpy(), qtype(name))
    assert decoded.shape == (block, block)
    np.testing.assert_array_equal(np.abs(decoded).argmax(axis=1), np.arange(block))
    off_diagonal = decoded - np.diag(np.diag(decoded))
    assert np.abs(off_diagonal).max() <= 0.05 * np.abs(np.diag(decoded)).min()
    np.testing.assert_allclose(np.diag(decoded), x.diagonal().numpy(), rtol=0.08)


def _sample(dist: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    if dist == "normal":
        return torch.randn(64, 1024, generator=gen) * 0.02
    return torch.distributions.StudentT(torch.tensor(3.0)).sample((64, 1024)) * 0.02  # heavy tails, like weights


@pytest.mark.parametrize("dist", ["normal", "student-t"])
@pytest.mark.parametrize("name", KQUANTS)
def test_kquant_error_is_below_round_to_nearest(name, dist):
    torch.manual_seed(4)
    x = _sample(dist)
    packed = quantize(x, name)
    block, size = GGML_QUANT_SIZES[qtype(name)]
    assert packed.shape == (64, 1024 // block * size)
    ours = gguf_dequantize(packed.numpy(), qtype(name))
    baseline = round_to_nearest(x.numpy(), name)
    ours_mse, baseline_mse = _mse(ours, x.numpy()), _mse(baseline, x.numpy())
    assert ours_mse < baseline_mse, (ours_mse, baseline_mse)


def test_kquants_handle_degenerate_blocks():
    x = awkward(rows=16, cols=512)
    for name in KQUANTS:
        decoded = gguf_dequantize(quantize(x, name).numpy(), qtype(name))
        assert np.isfinite(decoded).all(), name
        assert (decoded[[0, 9, 10]] == 0).all(), name               # zeros (of either sign) stay zero
        np.testing.assert_allclose(decoded[1], 0.75, rtol=0.02)     # a constant survives
        random_rows = x[11:].numpy()
        assert _mse(decoded[11:], random_rows) < 0.01 * float((random_rows ** 2).mean()), name


def test_leading_dimensions_are_kept():
    x = torch.randn(2, 3, 256)
    assert quantize(x, "Q6_K").shape == (2, 3, 210)
    np.testing.assert_array_equal(quantize(x, "Q8_0").reshape(6, -1).numpy(),
                                  gguf_quantize(x.reshape(6, 256).numpy(), qtype("Q8_0")))


def test_bad_requests_are_typed_errors():
    with pytest.raises(UnsupportedQuantTypeError, match="Q2_K"):
        quantize(torch.randn(4, 256), "Q2_K")
    with pytest.raises(UnsupportedQuantTypeError, match="NOPE"):
        quantize(torch.randn(4, 256), "NOPE")
    with pytest.raises(ShapeMismatchError, match="multiple of 256.*blk.0.attn_q"):
        quantize(torch.randn(4, 96), "Q4_K", name="blk.0.attn_q.weight")


@pytest.mark.gpu
@pytest.mark.parametrize("name", LEGACY + KQUANTS)
def test_cuda_matches_the_cpu_reference(name):
    x = awkward()
    on_gpu = quantize(x.cuda(), name).cpu()
    if name in LEGACY:
        np.testing.assert_array_equal(on_gpu.numpy(), gguf_quantize(x.numpy(), qtype(name)))
    else:
        decoded = gguf_dequantize(on_gpu.numpy(), qtype(name))
        cpu_decoded = gguf_dequantize(quantize(x, name).numpy(), qtype(name))
        assert _mse(decoded, x.numpy()) <= 1.01 * _mse(cpu_decoded, x.numpy())


# ---- an independent round-to-nearest quantizer for the K formats (numpy, decoded values only) ----

def _mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())


def _fp16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float32)


def _six_bit(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sub-block values as 6-bit multiples of an fp16 super-scale (what Q4_K/Q5_K store)."""
    peak = values.max(-1, keepdims=True)
    step = np.where(peak > 0, peak / 63, 1.0)
    return np.where(peak > 0, np.clip(np.round(values / step), 0, 63), 0), _fp16(peak / 63)


def round_to_nearest(x: np.ndarray, name: str) -> np.ndarray:
    """Range-based scales, nearest codes, the format's own scale quantization: no search."""
    if name == "Q6_K":
        return _rtn_symmetric(x)
    nmax = 15 if name == "Q4_K" else 31
    sub = x.reshape(-1, 8, 32)
    low = np.minimum(sub.min(-1), 0)
    scale_codes, d = _six_bit((sub.max(-1) - low) / nmax)
    min_codes, dmin = _six_bit(-low)
    step, shift = (d * scale_codes)[..., None], (dmin * min_codes)[..., None]
    codes = np.where(step > 0, np.clip(np.round((sub + shift) / np.where(step > 0, step, 1)), 0, nmax), 0)
    return (step * codes - shift).reshape(x.shape)


def _rtn_symmetric(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)
    peak = np.take_along_axis(sub, np.abs(sub).argmax(-1)[..., None], -1)[..., 0]
    scale = peak / -32
    biggest = np.take_along_axis(scale, np.abs(scale).argmax(-1)[..., None], -1)
    d = _fp16(biggest / -128)
    safe_d = np.where(d != 0, d, 1)
    step = (d * np.where(d != 0, np.clip(np.round(scale / safe_d), -128, 127), 0))[..., None]
    codes = np.where(step != 0, np.clip(np.round(sub / np.where(step != 0, step, 1)), -32, 31), 0)
    return (step * codes).reshape(x.shape)
