"""The norm and gated-activation kernels that also write their output's int8 blocks
(``toolkit/kernels/fused``: ``rms_norm_int8``, ``add_rms_norm_int8``, ``gated_activation_int8``), and the
GGUF activation quantizer that now shares their rounding (``triton_int8``), run by Triton's interpreter on
the CPU.

Oracles: the blocks must equal ``int8_blocks.quantize_reference`` (torch) of the output the kernel stored
(``int8_checks.assert_blocks``: exact but within 1e-4 of a rounding tie), and the stored output must equal
the plain op's kernel. tests/test_fused_kernels.py checks the compiled kernels on a GPU.

Skipped where Triton is not installed and on CUDA machines; where this process imported Triton compiled
earlier, one test runs this file in a fresh process with the interpreter on (tests/triton_interpreter.py).
"""
from __future__ import annotations

import importlib

import pytest
import torch

from int8_checks import assert_blocks
from triton_interpreter import interpreted_fused_ops, interpreted_gguf_chain, rerun_in_fresh_process, start_interpreter

INTERPRETED = start_interpreter("test_fused_kernels.py")
from toolkit.kernels import reference  # noqa: E402

here = pytest.mark.skipif(not INTERPRETED, reason="Triton was imported compiled; run in a fresh process")

if INTERPRETED:
    ops = interpreted_fused_ops()


@pytest.mark.skipif(INTERPRETED, reason="this process runs the tests itself")
def test_in_a_fresh_interpreter_process():
    rerun_in_fresh_process(__file__)


def _rows(seed: int, rows: int, cols: int, dtype) -> torch.Tensor:
    """Rows with blocks of very different sizes, an all-zero block and a ±127-exact block."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * torch.logspace(-3, 2, cols // 32).repeat_interleave(32)
    x[0, :32] = 0.0
    x[-1, 32:64] = torch.arange(-16, 16) * 0.25
    return x.to(dtype)


@here
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("cols", [96, 256])             # 96: a row narrower than the kernel's power-of-two block
@pytest.mark.parametrize("sums", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_norm_writes_its_output_blocks(dtype, cols, sums, offset):
    x = _rows(cols, 5, cols, dtype)
    weight = (1 + 0.3 * torch.randn(cols, generator=torch.Generator().manual_seed(1))).to(dtype)
    out, *blocks = ops.rms_norm_int8(x, weight, 1e-6, offset, sums)
    assert torch.equal(out, ops.rms_norm(x, weight, 1e-6, offset))
    torch.testing.assert_close(out, reference.rms_norm(x, weight, 1e-6, offset), rtol=2e-3, atol=2e-3)
    assert_blocks(blocks, out, sums)


@here
@pytest.mark.parametrize("sums", [False, True])
def test_add_norm_writes_the_normalised_blocks(sums):
    x, residual = _rows(3, 4, 128, torch.float16), _rows(4, 4, 128, torch.float16)
    weight = torch.rand(128, generator=torch.Generator().manual_seed(2)).to(torch.float16) + 0.5
    out, total, *blocks = ops.add_rms_norm_int8(x, residual, weight, 1e-6, 0.0, sums)
    plain_out, plain_total = ops.add_rms_norm(x, residual, weight, 1e-6, 0.0)
    assert torch.equal(out, plain_out) and torch.equal(total, plain_total)
    assert_blocks(blocks, out, sums)


@here
@pytest.mark.parametrize("cols", [96, 2048 + 64])       # 2,112: two column programs, the second partly masked
@pytest.mark.parametrize("sums", [False, True])
def test_gated_activation_writes_its_output_blocks(cols, sums):
    """silu (the gelu forms call libdevice, which the interpreter lacks; the GPU tests cover them)."""
    x = _rows(cols, 3, 2 * cols, torch.float32)
    out, *blocks = ops.gated_activation_int8(x, "silu", sums)
    assert torch.equal(out, ops.gated_activation(x, "silu"))
    torch.testing.assert_close(out, reference.gated_activation(x, "silu"), rtol=1e-4, atol=1e-5)
    assert_blocks(blocks, out, sums)


@here
@pytest.mark.parametrize("sums", [False, True])
def test_gguf_quantizer_rounds_like_the_fused_kernels(sums):
    """The GGUF activation quantizer (``quantize_activations``) shares ``round_int8_blocks``: same blocks."""
    interpreted_gguf_chain()
    triton_ops = importlib.import_module("toolkit.kernels.gguf.triton_ops")
    x = _rows(7, 3, 1024, torch.float32)
    got = triton_ops.quantize_activations(x, sums=sums)
    assert_blocks((got[0], got[1], got[2] if sums else None), x, sums)
