"""GGUFTensor: one tensor of a GGUF file as its packed rows, memory-mapped.

This is what the GGUF checkpoint yields for every tensor. Only the GGUF name maps and the GGUF
quant scheme look inside it; ``to_dense`` turns it into a plain torch tensor for parameters
that are not packed (norms, biases).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from toolkit.core.records import FrozenRecord
from toolkit.kernels import runtime

# Types whose rows are plain values; everything else is blocks the kernels dequantize.
DENSE_DTYPES = {int(GGMLQuantizationType.F32): torch.float32, int(GGMLQuantizationType.F16): torch.float16,
                int(GGMLQuantizationType.BF16): torch.bfloat16}


class GGUFTensor(FrozenRecord):
    """A GGUF tensor: ``shape`` is logical, in torch order (rows, cols); ``data`` is uint8
    ``[rows, row_bytes]`` (a 1-D tensor is one row), viewing the file's memory map. (A hand-written
    record, not a dataclass: a GGUF load imports this module; toolkit/core/records.py says why.)"""

    name: str
    qtype: int
    shape: tuple[int, ...]
    data: torch.Tensor

    def __init__(self, name: str, qtype: int, shape: tuple[int, ...], data: torch.Tensor):
        self.__dict__.update(name=name, qtype=qtype, shape=shape, data=data)

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    @property
    def rows(self) -> int:
        return int(self.data.shape[0])

    @property
    def cols(self) -> int:
        return int(self.shape[-1])

    @property
    def type_name(self) -> str:
        return type_name(self.qtype)

    def with_data(self, data: torch.Tensor) -> "GGUFTensor":
        """The same tensor over other rows (a row permutation keeps shape and type)."""
        return GGUFTensor(self.name, self.qtype, self.shape, data)

    def to_dense(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The values as a plain tensor of ``shape`` (float32 for quantized types unless ``dtype``)."""
        if self.qtype in DENSE_DTYPES:
            values = self.data.contiguous().view(DENSE_DTYPES[self.qtype])
        else:
            values = runtime.call("gguf_dequantize", self.data, self.qtype, self.cols, dtype or torch.float32)
        values = values.reshape(self.shape)
        return values if dtype is None else values.to(dtype)


def type_name(qtype: int) -> str:
    try:
        return GGMLQuantizationType(qtype).name
    except ValueError:
        return f"type {qtype}"


def from_reader_tensor(tensor) -> GGUFTensor:
    """Wrap a gguf-py ReaderTensor without copying: its memmap viewed as uint8 rows."""
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    qtype = int(tensor.tensor_type)
    block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    row_bytes = shape[-1] // block * type_bytes
    raw = np.asarray(tensor.data).view(np.uint8).reshape(-1, row_bytes)
    with warnings.catch_warnings():  # the map is read-only; nothing ever writes through this view
        warnings.simplefilter("ignore", UserWarning)
        data = torch.from_numpy(raw)
    return GGUFTensor(tensor.name, qtype, shape, data)
