"""Cutting packed 4-bit data and its statistics for one rank: the slice must dequantize to exactly
the same values as the whole tensor's slice.

Oracle: ``reference_dequantize_4bit`` (plain torch from bitsandbytes' format and code tables),
itself checked against bitsandbytes' ``dequantize_4bit`` on row-aligned weights, where every
bitsandbytes kernel is right; on rows that cut blocks its AVX-512 CPU kernel is not (see
toolkit/plugins/quant/bnb/dequant.py), which the last tests pin down."""
from __future__ import annotations

import pytest
import torch
from bitsandbytes.functional import dequantize_4bit, quantize_4bit

from toolkit.plugins.quant.bnb import blocks, dequant

from test_bnb_fixtures import reference_dequantize_4bit


def _quantized(rows, cols, *, block_size=64, double_quant=True, quant_type="nf4", seed=0):
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    packed, state = quantize_4bit(weight, blocksize=block_size, compress_statistics=double_quant,
                                  quant_type=quant_type)
    return packed.reshape(-1), state, reference_dequantize_4bit(packed, state)


def _dense(cut):
    packed, state = cut
    return dequant.dequantize_4bit(packed.view(-1, 1), state)


@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_row_slices_on_block_boundaries_are_exact(double_quant, quant_type):
    packed, state, full = _quantized(512, 128, double_quant=double_quant, quant_type=quant_type)
    # 128 rows x 128 cols = 256 blocks: starts on a nested block (keeps 8-bit absmax); 64 rows do not
    for start, rows in ((0, 128), (128, 128), (64, 64), (448, 64), (1, 1)):
        cut = blocks.slice_rows(packed, state, start, rows)
        assert cut is not None
        torch.testing.assert_close(_dense(cut), full[start: start + rows], rtol=0, atol=0)
        if double_quant:
            assert cut[1].nested == (start * 128 // 64 % 256 == 0)


def test_row_slices_that_cut_a_block_are_refused():
    packed, state, _ = _quantized(8, 40)  # 40 columns: rows straddle 64-element blocks
    assert blocks.slice_rows(packed, state, 1, 2) is None
    assert blocks.slice_rows(packed, state, 0, 8) is not None  # the whole tensor always works


@pytest.mark.parametrize("double_quant", [False, True])
def test_column_slices_on_block_boundaries_are_exact(double_quant):
    packed, state, full = _quantized(32, 256, double_quant=double_quant)
    for start, cols in ((0, 128), (128, 128), (64, 64)):
        cut = blocks.slice_cols(packed, state, start, cols)
        torch.testing.assert_close(_dense(cut), full[:, start: start + cols], rtol=0, atol=0)
    assert blocks.slice_cols(packed, state, 32, 64) is None  # starts mid-block
    assert blocks.slice_cols(packed, state, 0, 96) is None   # ends mid-block


def test_unnest_is_exact():
    packed, state, full = _quantized(64, 512, double_quant=True)
    flat = blocks.unnest(state)
    assert not flat.nested and flat.absmax.dtype == torch.float32
    torch.testing.assert_close(_dense((packed, flat)), full, rtol=0, atol=0)


def test_requantize_is_bitsandbytes_of_the_dequantized_slice():
    packed, state, full = _quantized(16, 64, double_quant=False)
    cut = blocks.requantize(packed, state, slice(0, 16), slice(0, 32), double_quant=False)
    reference = quantize_4bit(full[:, :32].contiguous(), blocksize=64, quant_type="nf4")
    torch.testing.assert_close(_dense(cut), reference_dequantize_4bit(*reference), rtol=0, atol=0)


@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_reference_dequantizer_is_bitsandbytes_on_aligned_rows(double_quant, quant_type):
    for rows, cols in ((64, 128), (8, 64), (1, 4096)):
        packed, state, reference = _quantized(rows, cols, double_quant=double_quant, quant_type=quant_type)
        torch.testing.assert_close(reference, dequantize_4bit(packed.view(-1, 1), state), rtol=0, atol=0)


@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("shape", [(64, 32), (32, 96), (128, 48), (8, 40)])
def test_rows_that_cut_blocks_dequantize_exactly(shape, double_quant):
    """Regression: on AVX-512 CPUs bitsandbytes 0.50's dequantize_4bit scaled these rows wrong."""
    packed, state, reference = _quantized(*shape, double_quant=double_quant)
    torch.testing.assert_close(dequant.dequantize_4bit(packed.view(-1, 1), state), reference, rtol=0, atol=0)


def test_matmul_on_rows_that_cut_blocks_is_exact():
    from toolkit.plugins.quant.bnb.kernels import bnb_4bit_matmul

    packed, state, reference = _quantized(64, 32)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(bnb_4bit_matmul(x, packed, state), x @ reference.T, rtol=1e-6, atol=1e-6)
