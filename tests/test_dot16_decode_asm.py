"""The PTX that turns quant bytes into floats in the 16-bit tensor-core GGUF kernel (``triton_dot16``:
``UNIT_FLOATS_PTX``, ``BYTE_FLOATS_PTX``), run on the CPU by the PTX emulator (tests/ptx_emulator.py): for every
byte in every lane of the packed word, the output register's bits must be the float32 the kernel's arithmetic
assumes (``1 + q / 128`` for ``q < 128``; ``1 + (q + 128) / 32768`` for ``q`` read as int8), computed here by
numpy, and the weight formula built on it must give ``q * scale - offset`` exactly. The compiled kernels are
checked on a GPU against gguf-py's dequantization (tests/test_gguf_kernels.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from ptx_emulator import run_asm

triton_dot16 = pytest.importorskip("toolkit.kernels.gguf.triton_dot16")


def _floats(asm: str, lanes: list[int]) -> list[float]:
    out = run_asm(asm, sum(byte << (8 * lane) for lane, byte in enumerate(lanes)))
    return [float(np.array(bits, dtype=np.uint32).view(np.float32)) for bits in out]


@pytest.mark.parametrize("first", range(0, 128, 5))
def test_unit_floats_put_each_byte_in_the_mantissa(first):
    lanes = [(first + 37 * lane) % 128 for lane in range(4)]
    got = _floats(triton_dot16.UNIT_FLOATS_PTX.value, lanes)
    assert got == [1 + q / 128 for q in lanes], lanes
    for q, u in zip(lanes, got):  # Q4_0's weight (q - 8) d, with a float32 scale d: u * 128 d - 136 d
        d = np.float32(np.float16(0.0137))
        assert np.float32(u) * np.float32(128 * d) - np.float32(136 * d) == np.float32((q - 8) * d)


@pytest.mark.parametrize("first", range(0, 256, 7))
def test_byte_floats_read_each_byte_as_int8(first):
    lanes = [(first + 101 * lane) % 256 for lane in range(4)]
    signed = [q - 256 if q >= 128 else q for q in lanes]
    assert _floats(triton_dot16.BYTE_FLOATS_PTX.value, lanes) == [1 + (q + 128) / 32768 for q in signed], lanes
