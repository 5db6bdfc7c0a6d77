"""The compiled CPU quantizer (``quant_cpu.cpp``): built on first use, cached per machine.

Built by gguf_cpu's build machinery (``Extension``: ``-O3 -march=native``, OpenMP, a cache keyed
by source, flags, compiler and CPU), plus ``-ffp-contract=off``: the encoders repeat the torch
path's float operations one for one, and a fused multiply-add would round differently. When the
build fails, ``available()`` says False after one warning and ``quantize()`` runs the torch path.

``TOOLKIT_GGUF_QUANT_COMPILED=0`` (read at each call) forces the torch path (A/B checks, benches).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..gguf_cpu.build import Extension

HERE = Path(__file__).parent
EXTENSION = Extension("toolkit_gguf_quant", [HERE / "quant_cpu.cpp"], [], "CPU GGUF quantizer",
                      cflags=("-ffp-contract=off",))
# GGMLQuantizationType numbers quant_cpu.cpp encodes
HANDLED = frozenset({2, 3, 6, 7, 8, 12, 13, 14})


def enabled() -> bool:
    return os.environ.get("TOOLKIT_GGUF_QUANT_COMPILED", "1") != "0"


def available() -> bool:
    """Compiled and usable (the first call builds it, or warns once and says False)."""
    return EXTENSION.ready()


def quantize_blocks(blocks: torch.Tensor, qtype: int, type_size: int) -> tuple[torch.Tensor, bool]:
    """[n, block] float32 CPU rows (made contiguous here) -> ([n, type_size] uint8, whether every
    input was finite), on torch's threads."""
    blocks = blocks.to(torch.float32).contiguous()
    out = torch.empty(blocks.shape[0], type_size, dtype=torch.uint8)
    if not blocks.shape[0]:
        return out, True
    return out, bool(EXTENSION.get().quantize(blocks.data_ptr(), out.data_ptr(), blocks.shape[0], int(qtype)))
