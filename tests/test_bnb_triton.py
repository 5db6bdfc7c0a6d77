"""The bitsandbytes Triton kernels (``toolkit/kernels/bnb/triton_kernels.py``) run by Triton's
interpreter on the CPU, against bitsandbytes' own CPU functions: ``dequantize_4bit`` and
``int8_vectorwise_dequant``, then a float32 matmul. Tiny shapes: the interpreter runs every
program in numpy. tests/test_bnb_triton_gpu.py checks the compiled kernels and their dispatch.

Skipped where Triton is not installed and on CUDA machines. The interpreter switch is read when
``@triton.jit`` decorates, so it must be set before Triton is first imported: where this process
imported Triton earlier (a run of several files), one test runs this file in a fresh process.

The tensor-core kernels (``triton_mma``) run here with their codebook loads; on a GPU they decode with the
PTX of ``mma_ops.decode_asm`` instead (tests/test_bnb_decode_asm.py, tests/test_bnb_mma_gpu.py).

Two interpreter limits of Triton 3.6 shape these tests: it calls ``int()`` on a one-element numpy
array for a loop bound taken from a kernel argument, which numpy >= 2.4 rejects, so ``fix_loop_bounds``
(tests/triton_interpreter.py) makes that conversion take the array's single element (the interpreter only; compiled kernels never
run this code); and its ``tl.dot`` on bfloat16 operands returns garbage, so the ``tl.dot`` path
(2..16 tokens) is checked with float16 activations here and with bfloat16 on the GPU.
"""
from __future__ import annotations

import pytest
import torch

from triton_interpreter import interpreted_modules, rerun_in_fresh_process, start_interpreter

INTERPRETED = start_interpreter("test_bnb_triton_gpu.py")
from bitsandbytes.functional import (dequantize_4bit, int8_vectorwise_dequant, int8_vectorwise_quant,  # noqa: E402
                                     quantize_4bit)

here = pytest.mark.skipif(not INTERPRETED, reason="Triton was imported compiled; run in a fresh process")


if INTERPRETED:
    _, _, mma, ops = interpreted_modules("toolkit.kernels.bnb.triton_kernels", "toolkit.kernels.bnb.triton_mma",
                                         "toolkit.kernels.bnb.mma_ops", "toolkit.kernels.bnb.triton_ops")


@pytest.mark.skipif(INTERPRETED, reason="this process runs the tests itself")
def test_in_a_fresh_interpreter_process():
    rerun_in_fresh_process(__file__)


def _close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Within the output dtype's rounding (the kernel returns x's dtype; float32 inside)."""
    assert got.dtype == dtype and got.shape == expected.shape
    scale = expected.abs().max().item()
    eps = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -9
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=scale * eps)


# (tokens, activation dtype, config): the float32 multiply-accumulate path at one token, the tl.dot
# path (16-token tiles) at three, and the per-token multiply-accumulate (no tl.dot) at three. BN=16 over 24 rows leaves a partial last row tile.
PATHS = {"decode": (1, torch.bfloat16, (1, 16, 128)), "small-batch": (3, torch.float16, (16, 16, 64)),
         "few-tokens-fma": (3, torch.bfloat16, (4, 16, 64, 4, 2, False))}


@here
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("quant_type,nested,blocksize", [("nf4", False, 64), ("nf4", True, 64), ("fp4", False, 64),
                                                          ("fp4", True, 64), ("nf4", False, 32), ("nf4", True, 128)])
def test_4bit_kernel_matches_bitsandbytes_dequantize(path, quant_type, nested, blocksize):
    tokens, dtype, config = PATHS[path]
    g = torch.Generator().manual_seed(blocksize + nested)
    weight = torch.randn(24, 256, generator=g)
    packed, state = quantize_4bit(weight, blocksize=blocksize, quant_type=quant_type, compress_statistics=nested)
    assert state.nested == nested
    x = torch.randn(tokens, 256, generator=g).to(dtype)
    # bitsandbytes' dequantized weight, in x's dtype as bitsandbytes' matmul_4bit would use it
    expected = x.float() @ dequantize_4bit(packed, state).to(dtype).float().T
    for split in (1, 2):  # 2: float32 partial sums over halves of K, reduced by the caller
        got = ops.fourbit_matmul(x, packed.view(-1), state, ops.MatmulConfig(*config), split=split)
        _close(got, expected, dtype)


@here
def test_4bit_kernel_reads_each_segment_of_a_flat_buffer():
    """A fused projection's segments are views into one flat byte buffer at row offsets."""
    g = torch.Generator().manual_seed(3)
    first, second = torch.randn(16, 128, generator=g), torch.randn(8, 128, generator=g)
    (p1, s1), (p2, s2) = (quantize_4bit(w, blocksize=64, quant_type="nf4") for w in (first, second))
    flat = torch.cat([p1.view(-1), p2.view(-1)])
    x = torch.randn(1, 128, generator=g).to(torch.bfloat16)
    got = ops.fourbit_matmul(x, flat[p1.numel():], s2, ops.MatmulConfig(1, 8, 128), split=1)
    _close(got, x.float() @ dequantize_4bit(p2, s2).float().T, torch.bfloat16)


@here
@pytest.mark.parametrize("path", list(PATHS))
def test_int8_kernel_matches_bitsandbytes_dequantize(path):
    tokens, dtype, config = PATHS[path]
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(24, 256, generator=g)
    weight[:, 5] *= 40  # an outlier column: weight-only int8 computes it like every other column
    data, scb, _ = int8_vectorwise_quant(weight.half())
    x = torch.randn(tokens, 256, generator=g).to(dtype)
    expected = x.float() @ int8_vectorwise_dequant(data, scb).T
    for split in (1, 2):
        _close(ops.int8_matmul(x, data, scb, ops.MatmulConfig(*config), split=split), expected, dtype)


# ---- the token-unrolled GEMVs (triton_gemv_tokens) ------------------------------------------------
# Programs of 8 rows x 64 columns over 24 rows and 256 columns (several K steps; with split=2 float32
# partial sums over halves of K). Each case: (tokens, activation dtype, quant type, nested, block
# size, lookup table, splits); the interpreter runs every token's code in numpy, so 16 tokens once.
FOURBIT_TOKEN_CASES = [
    (1, torch.bfloat16, "nf4", False, 64, 16, (1, 2)), (1, torch.bfloat16, "fp4", True, 32, 256, (1,)),
    (3, torch.float16, "nf4", False, 64, 16, (1, 2)), (3, torch.bfloat16, "nf4", True, 64, 16, (1, 2)),
    (3, torch.bfloat16, "fp4", False, 128, 16, (1,)), (3, torch.bfloat16, "fp4", True, 32, 16, (1,)),
    (3, torch.bfloat16, "nf4", False, 64, 256, (1, 2)), (3, torch.float16, "nf4", True, 64, 256, (1,)),
    (16, torch.bfloat16, "nf4", True, 64, 16, (1,))]


def _fourbit_weight(seed: int, rows: int, quant_type: str, nested: bool, blocksize: int, cols: int = 256):
    g = torch.Generator().manual_seed(seed)
    packed, state = quantize_4bit(torch.randn(rows, cols, generator=g), blocksize=blocksize, quant_type=quant_type,
                                  compress_statistics=nested)
    assert state.nested == nested
    return packed.view(-1), state


@here
@pytest.mark.parametrize("case", FOURBIT_TOKEN_CASES, ids=lambda c: f"T{c[0]}-{c[2]}-nested{c[3]}-bs{c[4]}-lut{c[5]}")
def test_4bit_tokens_kernel_matches_bitsandbytes_dequantize(case):
    tokens, dtype, quant_type, nested, blocksize, lut, splits = case
    packed, state = _fourbit_weight(blocksize + nested, 24, quant_type, nested, blocksize)
    x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(5)).to(dtype)
    expected = x.float() @ dequantize_4bit(packed, state).float().T
    for split in splits:
        got = ops.fourbit_tokens_matmul(x, packed, state, ops.TokensConfig(bn=8, bk=64, num_warps=1, lut=lut),
                                        split=split)
        _close(got, expected, dtype)


def _gathered(parts):
    """Segments quantized on their own, their statistics moved into shared buffers the way
    ``Bnb4bitParameter.gather_statistics`` lays them out."""
    from toolkit.plugins.quant.bnb.params4 import gather_states

    states = [state for _, state in parts]
    gather_states(states)
    return torch.cat([packed for packed, _ in parts]), states


@here
@pytest.mark.parametrize("nested", [False, True])
def test_4bit_tokens_kernel_runs_fused_segments_in_one_launch(nested):
    """q/k/v-like segments of 24, 8 and 8 rows (one row tile straddles two segments at BN=16)."""
    parts = [_fourbit_weight(seed, rows, "nf4", nested, 64) for seed, rows in ((1, 24), (2, 8), (3, 8))]
    expected_weight = torch.cat([dequantize_4bit(packed, state) for packed, state in parts]).float()
    packed, states = _gathered(parts)
    assert ops.segments_gathered(states)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    for lut in (16, 256):
        got = ops.fourbit_tokens_matmul(x, packed, states, ops.TokensConfig(bn=16, bk=128, num_warps=1, lut=lut),
                                        split=1)
        _close(got, x.float() @ expected_weight.T, torch.bfloat16)


@here
@pytest.mark.parametrize("tokens,dtype", [(1, torch.bfloat16), (3, torch.float16), (16, torch.bfloat16)])
def test_int8_tokens_kernel_matches_bitsandbytes_dequantize(tokens, dtype):
    g = torch.Generator().manual_seed(11)
    weight = torch.randn(24, 256, generator=g)
    weight[:, 3] *= 40
    data, scb, _ = int8_vectorwise_quant(weight.half())
    x = torch.randn(tokens, 256, generator=g).to(dtype)
    expected = x.float() @ int8_vectorwise_dequant(data, scb).T
    for split in (1, 2):
        got = ops.int8_tokens_matmul(x, data, scb, ops.TokensConfig(bn=8, bk=64, num_warps=1), split=split)
        _close(got, expected, dtype)


# ---- the tensor-core kernels (triton_mma), float16 (the interpreter's bfloat16 tl.dot is wrong) ---------
# (tokens, quant type, nested, block size, rows per program, columns per step, splits): 24 rows at BN=16 leave
# a partial row tile; 128-column steps of 32-column blocks take 4 chunks, of 256-column blocks half a block.
FOURBIT_MMA_CASES = [(2, "nf4", False, 64, 16, 128, (1, 2)), (5, "nf4", True, 64, 32, 64, (1, 2)),
                     (16, "fp4", False, 32, 16, 128, (1,)), (3, "fp4", True, 128, 16, 128, (1,)),
                     (8, "nf4", True, 256, 32, 128, (1, 2))]


@here
@pytest.mark.parametrize("case", FOURBIT_MMA_CASES, ids=lambda c: f"T{c[0]}-{c[1]}-nested{c[2]}-bs{c[3]}")
def test_4bit_mma_kernel_matches_bitsandbytes_dequantize(case):
    tokens, quant_type, nested, blocksize, bn, bk, splits = case
    packed, state = _fourbit_weight(blocksize * 3 + nested, 24, quant_type, nested, blocksize, cols=512)
    x = torch.randn(tokens, 512, generator=torch.Generator().manual_seed(6)).to(torch.float16)
    expected = x.float() @ dequantize_4bit(packed, state).float().T
    for split in splits:
        got = mma.fourbit_mma_matmul(x, packed, state, mma.MmaConfig(bn=bn, bk=bk, num_warps=4), split=split)
        _close(got, expected, torch.float16)


@here
def test_4bit_mma_kernel_runs_fused_segments_in_one_launch():
    """q/k/v-like segments of 24, 8 and 8 rows, double-quantized (row tiles straddle segments at BN=16)."""
    parts = [_fourbit_weight(seed, rows, "nf4", True, 64) for seed, rows in ((4, 24), (5, 8), (6, 8))]
    expected_weight = torch.cat([dequantize_4bit(packed, state) for packed, state in parts]).float()
    packed, states = _gathered(parts)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(8)).to(torch.float16)
    got = mma.fourbit_mma_matmul(x, packed, states, mma.MmaConfig(bn=16, bk=128, num_warps=4), split=1)
    _close(got, x.float() @ expected_weight.T, torch.float16)


@here
@pytest.mark.parametrize("tokens,bn,bk", [(2, 16, 64), (9, 32, 128), (16, 16, 256)])
def test_int8_mma_kernel_matches_bitsandbytes_dequantize(tokens, bn, bk):
    g = torch.Generator().manual_seed(12)
    weight = torch.randn(24, 512, generator=g)
    weight[:, 4] *= 40
    data, scb, _ = int8_vectorwise_quant(weight.half())
    x = torch.randn(tokens, 512, generator=g).to(torch.float16)
    expected = x.float() @ int8_vectorwise_dequant(data, scb).T
    for split in (1, 2):
        got = mma.int8_mma_matmul(x, data, scb, mma.MmaConfig(bn=bn, bk=bk, num_warps=4), split=split)
        _close(got, expected, torch.float16)
