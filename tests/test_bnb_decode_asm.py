"""The PTX that decodes 4-bit codes on the GPU (``toolkit/kernels/bnb/mma_ops.decode_asm``), run on the CPU
by a small emulator of the instructions it uses, written from the PTX ISA's definitions (``prmt.b32`` in
its default and sign-replicate modes, ``lop3.b32``, shifts, logic): for every byte value, each nibble must
come out as bitsandbytes' codebook entry rounded to the activations' dtype by torch. The compiled PTX itself
is checked on a GPU against bitsandbytes (tests/test_bnb_mma_gpu.py); this pins the byte-permute scheme
where no GPU is.
"""
from __future__ import annotations

import pytest
import torch

from toolkit.kernels.bnb.mma_ops import decode_asm

functional = pytest.importorskip("bitsandbytes.functional")
MASK = 0xFFFFFFFF


def _prmt(a: int, b: int, selector: int) -> int:
    """``prmt.b32 d, a, b, c`` (default mode): byte i of d is byte c[4i+2:4i] of {b, a}, or with c[4i+3] set
    that byte's sign bit replicated."""
    source = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = source[nibble & 7]
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, table: int) -> int:
    """``lop3.b32 d, a, b, c, immLut``: bit j of d is bit (a_j << 2 | b_j << 1 | c_j) of the table."""
    return sum(((table >> ((((a >> j) & 1) << 2) | (((b >> j) & 1) << 1) | ((c >> j) & 1))) & 1) << j
               for j in range(32))


OPS = {"mov.b32": lambda a: a, "shr.u32": lambda a, n: a >> n, "shl.b32": lambda a, n: (a << n) & MASK,
       "and.b32": lambda a, b: a & b, "or.b32": lambda a, b: a | b, "prmt.b32": _prmt, "lop3.b32": _lop3}


def _run(asm: str, word: int) -> list[int]:
    """The four output registers ``$0..$3`` of ``asm`` for input register ``$4 = word``."""
    registers = {"$4": word}

    def value(operand: str) -> int:
        return int(operand, 0) if operand[0].isdigit() else registers[operand]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, operands = line.split(None, 1)
        dest, *sources = (operand.strip() for operand in operands.split(","))
        registers[dest] = OPS[op](*(value(source) for source in sources))  # KeyError: an op the emulator lacks
    return [registers[f"${i}"] for i in range(4)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_decoder_gives_every_nibble_its_codebook_value(quant_type, dtype):
    codes = functional.get_4bit_type(quant_type, device="cpu")
    expected = [int(bits) & 0xFFFF for bits in codes.to(dtype).view(torch.int16)]
    asm = decode_asm(codes.tolist(), dtype)
    for first in range(256):  # every byte value in every lane of the 32-bit word
        lanes = [(first + 67 * lane) % 256 for lane in range(4)]
        out = _run(asm, sum(byte << (8 * lane) for lane, byte in enumerate(lanes)))
        for lane, byte in enumerate(lanes):
            high = (out[lane // 2] >> (16 * (lane % 2))) & 0xFFFF       # $0, $1: high nibbles, 2 per register
            low = (out[2 + lane // 2] >> (16 * (lane % 2))) & 0xFFFF    # $2, $3: low nibbles
            assert (high, low) == (expected[byte >> 4], expected[byte & 15]), (quant_type, byte, lane)
