"""Cutting a 4-bit weight (packed bytes + QuantState) into a tensor-parallel rank's slice.

bitsandbytes quantizes the row-major flattened weight in blocks of ``blocksize`` elements,
two 4-bit codes per byte, one absmax per block (itself 8-bit quantized in blocks of 256
with double quantization). A slice can be cut out of the bytes and statistics exactly when
it consists of whole blocks:

* rows ``[start, start + rows)`` (output-dim splits): the flattened range starts on a block
  boundary and ends on one (or at the end);
* columns ``[start, start + cols)`` (input-dim splits): every row is a whole number of blocks
  and the column range starts and ends on block boundaries.

Otherwise the caller dequantizes and re-quantizes the slice (``requantize``). Double-quant
statistics whose nested blocks a slice would cut are expanded to float32 (``unnest``), which
is exact: it is the same computation bitsandbytes performs before every dequantization.
"""
from __future__ import annotations

import torch
from bitsandbytes.functional import QuantState, dequantize_blockwise, quantize_4bit

from .dequant import dequantize_4bit

Packed = tuple[torch.Tensor, QuantState]  # flat uint8 bytes and their state


def unnest(state: QuantState) -> QuantState:
    """The same state with float32 absmax instead of 8-bit absmax + nested statistics."""
    if not state.nested:
        return state
    absmax = (dequantize_blockwise(state.absmax, state.state2) + state.offset).float()
    return _with(state, absmax=absmax, offset=None, state2=None)


def slice_rows(packed: torch.Tensor, state: QuantState, start: int, rows: int) -> Packed | None:
    """Rows ``[start, start + rows)`` cut from the bytes and statistics, or None if that would cut a block."""
    num_rows, num_cols = state.shape
    first, count = start * num_cols, rows * num_cols
    size = state.blocksize
    ends_cleanly = count % size == 0 or start + rows == num_rows
    if first % size or first % 2 or count % 2 or not ends_cleanly:
        return None
    first_block, num_blocks = first // size, -(-count // size)
    if state.nested and first_block % state.state2.blocksize:
        state = unnest(state)  # the 8-bit absmax would be cut mid nested block
    data = packed[first // 2: (first + count) // 2]
    if not state.nested:
        return data, _with(state, absmax=state.absmax[first_block: first_block + num_blocks], shape=(rows, num_cols))
    nested = state.state2.blocksize
    state2 = _with(state.state2, absmax=state.state2.absmax[first_block // nested: -(-(first_block + num_blocks) // nested)])
    return data, _with(state, absmax=state.absmax[first_block: first_block + num_blocks], shape=(rows, num_cols),
                       state2=state2)


def slice_cols(packed: torch.Tensor, state: QuantState, start: int, cols: int) -> Packed | None:
    """Columns ``[start, start + cols)`` of every row, or None if a row or the range cuts a block."""
    num_rows, num_cols = state.shape
    size = state.blocksize
    if num_cols % size or start % size or cols % size:
        return None
    state = unnest(state)  # the kept absmax entries are no longer contiguous nested blocks
    # contiguous(): a one-block-per-row cut reshapes to a strided view, and bitsandbytes kernels need dense data
    data = packed.view(num_rows, num_cols // 2)[:, start // 2: (start + cols) // 2].contiguous().reshape(-1)
    absmax = state.absmax.view(num_rows, num_cols // size)[:, start // size: (start + cols) // size]
    absmax = absmax.contiguous().reshape(-1)
    return data, _with(state, absmax=absmax, shape=(num_rows, cols))


def requantize(packed: torch.Tensor, state: QuantState, rows: slice, cols: slice, *, double_quant: bool) -> Packed:
    """Dequantize with bitsandbytes, take ``[rows, cols]`` and quantize that with the same type and block size."""
    dense = dequantize_4bit(packed.view(-1, 1), state)[rows, cols].contiguous()
    return quantize_packed(dense, quant_type=state.quant_type, block_size=state.blocksize, double_quant=double_quant)


def quantize_packed(dense: torch.Tensor, *, quant_type: str, block_size: int, double_quant: bool) -> Packed:
    """bitsandbytes.quantize_4bit of a [rows, cols] tensor, returning flat bytes."""
    data, state = quantize_4bit(dense.contiguous(), blocksize=block_size, compress_statistics=double_quant,
                                quant_type=quant_type)
    return data.reshape(-1), state


def _with(state: QuantState, **changes) -> QuantState:
    """A copy of ``state`` with some fields replaced (QuantState has no copy-with of its own)."""
    fields = dict(absmax=state.absmax, shape=state.shape, code=state.code, blocksize=state.blocksize,
                  quant_type=state.quant_type, dtype=state.dtype, offset=state.offset, state2=state.state2)
    fields.update(changes)
    if fields["shape"] is not None:
        fields["shape"] = torch.Size(fields["shape"])
    return QuantState(**fields)
