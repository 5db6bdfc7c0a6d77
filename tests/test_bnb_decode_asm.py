"""The PTX that decodes 4-bit codes on the GPU (``toolkit/kernels/bnb/mma_ops.decode_asm``), run on the CPU
by a small emulator of the instructions it uses (tests/ptx_emulator.py): for every byte value, each nibble must
come out as bitsandbytes' codebook entry rounded to the activations' dtype by torch. The compiled PTX itself
is checked on a GPU against bitsandbytes (tests/test_bnb_mma_gpu.py); this pins the byte-permute scheme
where no GPU is.
"""
from __future__ import annotations

import pytest
import torch

from ptx_emulator import run_asm
from toolkit.kernels.bnb.mma_ops import decode_asm

functional = pytest.importorskip("bitsandbytes.functional")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_decoder_gives_every_nibble_its_codebook_value(quant_type, dtype):
    codes = functional.get_4bit_type(quant_type, device="cpu")
    expected = [int(bits) & 0xFFFF for bits in codes.to(dtype).view(torch.int16)]
    asm = decode_asm(codes.tolist(), dtype)
    for first in range(256):  # every byte value in every lane of the 32-bit word
        lanes = [(first + 67 * lane) % 256 for lane in range(4)]
        out = run_asm(asm, sum(byte << (8 * lane) for lane, byte in enumerate(lanes)))
        for lane, byte in enumerate(lanes):
            high = (out[lane // 2] >> (16 * (lane % 2))) & 0xFFFF       # $0, $1: high nibbles, 2 per register
            low = (out[2 + lane // 2] >> (16 * (lane % 2))) & 0xFFFF    # $2, $3: low nibbles
            assert (high, low) == (expected[byte >> 4], expected[byte & 15]), (quant_type, byte, lane)
