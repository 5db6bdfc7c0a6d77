"""The token-unrolled dp4a GEMV (``toolkit/kernels/gguf/triton_gemv_tokens.py``) run by Triton's
interpreter on the CPU: every result against float64 on gguf-py's dequantization of random valid
blocks, within the bound of rounding the activations to int8 blocks of 32 (the one approximation
the kernel makes; integer sums are exact). tests/test_gguf_kernels.py checks the compiled kernel on
the GPU. The interpreter switch must be set before Triton is first imported: where this process
imported Triton earlier (a run of several files), one test runs this file in a fresh process."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from triton_interpreter import rerun_in_fresh_process, start_interpreter

INTERPRETED = start_interpreter("test_gguf_kernels.py")
from test_gguf_kernels import activation_rounding_bound, oracle, random_blocks  # noqa: E402

here = pytest.mark.skipif(not INTERPRETED, reason="Triton was imported compiled; run in a fresh process")
if INTERPRETED:
    ops = importlib.import_module("toolkit.kernels.gguf.triton_ops")


@here
@pytest.mark.parametrize("name", ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_tokens_gemv_within_activation_rounding(name):
    from gguf import GGMLQuantizationType
    qtype = int(GGMLQuantizationType[name])
    rows, cols = 3, 512
    blocks = random_blocks(name, rows, cols, np.random.default_rng(5))
    packed, weight = torch.from_numpy(blocks), oracle(blocks, name).double()
    generator = torch.Generator().manual_seed(6)
    # one step per split, and two steps of 256 columns (the kernel's first step runs before its loop)
    for tokens, config in ((1, ops.GemvConfig(bn=2, bk=512, split=1)), (3, ops.GemvConfig(bn=4, bk=256, split=2)),
                           (8, ops.GemvConfig(bn=1, bk=512, split=1)), (1, ops.GemvConfig(bn=2, bk=256, split=1)),
                           (5, ops.GemvConfig(bn=1, bk=256, split=1))):
        x = torch.randn(tokens, cols, generator=generator).to(torch.bfloat16)
        got = ops.dp4a_tokens_matmul(x, packed, qtype, cols, config)
        assert got.shape == (tokens, rows) and got.dtype == torch.bfloat16
        exact = x.double() @ weight.T
        bound = 3 * 2 ** -8 * (x.double().abs() @ weight.abs().T) + activation_rounding_bound(x, weight)
        assert ((got.double() - exact).abs() <= bound).all(), (name, tokens, (got.double() - exact).abs().max())


@pytest.mark.skipif(INTERPRETED, reason="runs the file itself")
def test_in_fresh_interpreter_process():
    rerun_in_fresh_process(__file__)
