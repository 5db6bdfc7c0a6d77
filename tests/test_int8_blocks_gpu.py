"""Int8 activation blocks on CUDA: the norm and gated-activation kernels that write them (against the torch
rounding, ``int8_checks.assert_blocks``), and the GGUF matmuls that read them (``toolkit/kernels/int8_blocks.py``).

A matmul fed attached blocks must give exactly what it gives when it rounds the activations itself: the
blocks are the same bits (one rounding function, ``triton_int8.round_int8_blocks``, on the same stored values).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from int8_checks import assert_blocks
from toolkit.kernels import reference
from toolkit.kernels.int8_blocks import Int8Input, attach, attached

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernels():
    from toolkit.kernels.fused import ops as fused  # noqa: PLC0415 - needs Triton
    from toolkit.kernels.gguf import triton_ops  # noqa: PLC0415
    return fused, triton_ops


def _x(rows: int, cols: int, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(rows, cols, generator=gen, device="cuda") * 3).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,cols", [(1, 4096), (8, 2048), (3, 1536)])
@pytest.mark.parametrize("sums", [False, True])
def test_norms_write_their_output_blocks(kernels, dtype, rows, cols, sums):
    fused, triton_ops = kernels
    x, residual = _x(rows, cols, dtype, cols), _x(rows, cols, dtype, cols + 1)
    weight = (1 + 0.3 * _x(1, cols, torch.float32, 3)[0]).to(dtype)
    out, *blocks = fused.rms_norm_int8(x, weight, 1e-6, 0.0, sums)
    assert torch.equal(out, fused.rms_norm(x, weight, 1e-6, 0.0))
    assert_blocks(blocks, out, sums)
    # the GGUF quantizer rounds the same stored values to the same bits
    again = triton_ops.quantize_activations(out, sums=sums)
    assert torch.equal(blocks[0], again[0]) and torch.equal(blocks[1], again[1])
    out, total, *blocks = fused.add_rms_norm_int8(x, residual, weight, 1e-6, 1.0, sums)
    plain_out, plain_total = fused.add_rms_norm(x, residual, weight, 1e-6, 1.0)
    assert torch.equal(out, plain_out) and torch.equal(total, plain_total)
    assert_blocks(blocks, out, sums)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("activation", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("rows,cols", [(1, 14336), (64, 768), (5, 96)])
@pytest.mark.parametrize("sums", [False, True])
def test_gated_activation_writes_its_output_blocks(kernels, dtype, activation, rows, cols, sums):
    fused, _ = kernels
    x = _x(rows, 2 * cols, dtype, rows + cols)
    out, *blocks = fused.gated_activation_int8(x, activation, sums)
    assert torch.equal(out, fused.gated_activation(x, activation))
    assert ((out.double() - reference.gated_activation(x, activation).double()).norm()
            / out.double().norm()).item() < 1e-2
    assert_blocks(blocks, out, sums)


def _packed(name: str, rows: int, cols: int, seed: int) -> torch.Tensor:
    """gguf-py's quantization of normal weights (Q4_0, Q8_0) or random valid K-quant blocks, on the GPU."""
    from test_gguf_kernels import random_blocks  # noqa: PLC0415
    return torch.from_numpy(random_blocks(name, rows, cols, np.random.default_rng(seed))).cuda()


@pytest.mark.parametrize("name,tokens", [("Q4_K", 1), ("Q4_K", 4), ("Q4_K", 12), ("Q6_K", 2), ("Q6_K", 16),
                                         ("Q4_0", 1), ("Q4_0", 12), ("Q8_0", 3), ("Q5_K", 8)])
def test_gguf_matmul_reads_attached_blocks_as_its_own(kernels, name, tokens, monkeypatch):
    """Same output bits with the norm's blocks attached as with the matmul rounding x itself; the blocks
    are taken (a poisoned copy of them changes the result). The int8 kernels' test: on an H100/H200 the Gluon
    16-bit kernels take 8-16 tokens of Q4_K/Q6_K (9-16 of Q4_0) and ask for no blocks, so they are turned off."""
    monkeypatch.setenv("TOOLKIT_GGUF_GLUON", "0")
    fused, triton_ops = kernels
    from gguf import GGMLQuantizationType  # noqa: PLC0415
    qtype, rows, cols = int(GGMLQuantizationType[name]), 512, 2048
    data = _packed(name, rows, cols, tokens)
    request = triton_ops.gguf_int8_input(data, qtype, cols, tokens)
    assert request is not None
    assert request.sums == (name in ("Q4_K", "Q5_K"))
    x = _x(tokens, cols, torch.bfloat16, 7)
    weight = torch.ones(cols, device="cuda", dtype=torch.bfloat16)
    normed, *blocks = fused.rms_norm_int8(x, weight, 1e-6, 0.0, request.sums)
    plain = normed.clone()                          # no blocks attached: the matmul rounds it
    attach(normed, *blocks)
    got = triton_ops.gguf_matmul(normed, data, qtype, cols)
    assert torch.equal(got, triton_ops.gguf_matmul(plain, data, qtype, cols))
    poisoned = normed.clone()
    attach(poisoned, torch.zeros_like(blocks[0]), blocks[1], blocks[2])
    assert not torch.equal(triton_ops.gguf_matmul(poisoned, data, qtype, cols), got)


@pytest.mark.parametrize("name,tokens", [("Q4_K", 8), ("Q6_K", 8), ("Q4_0", 4), ("Q4_K", 1), ("Q4_K", 32),
                                         ("Q6_K", 32), ("Q4_0", 32)])
def test_gguf_matmul_hands_on_its_split_sums(kernels, name, tokens):
    """``gguf_matmul_unreduced`` (kernels/split_sums.py): where the kernel splits K, partial sums whose sum
    (``sum_splits``) is bit for bit ``gguf_matmul``'s result; a tensor equal to it where it does not. At 17-64
    tokens Q4_K and Q6_K hand theirs on (``dot16_ops.DOT16_UNREDUCED_TYPES``), Q4_0 reduces its own."""
    fused, triton_ops = kernels
    from gguf import GGMLQuantizationType  # noqa: PLC0415
    from toolkit.kernels.split_sums import SplitSums  # noqa: PLC0415
    qtype, rows, cols = int(GGMLQuantizationType[name]), 512, 4096
    data = _packed(name, rows, cols, tokens)
    x = _x(tokens, cols, torch.bfloat16, 3)
    plain = triton_ops.gguf_matmul(x, data, qtype, cols)
    got = triton_ops.gguf_matmul_unreduced(x, data, qtype, cols)
    if isinstance(got, SplitSums):
        assert got.parts.shape[0] > 1 and got.dtype == torch.bfloat16
        assert torch.equal(fused.sum_splits(got.parts, got.dtype), plain)
    else:
        assert torch.equal(got, plain)
    if (name, tokens) in (("Q4_K", 8), ("Q4_K", 32), ("Q6_K", 32)):  # 512 rows: few row tiles, so K is split
        assert isinstance(got, SplitSums)
    if (name, tokens) == ("Q4_0", 32):
        assert not isinstance(got, SplitSums)


def test_gguf_int8_input_follows_the_kernel_choice(kernels):
    _, triton_ops = kernels
    from gguf import GGMLQuantizationType  # noqa: PLC0415
    q4k = int(GGMLQuantizationType.Q4_K)
    data = _packed("Q4_K", 256, 1024, 0)
    assert triton_ops.gguf_int8_input(data, q4k, 1024, 1) == Int8Input(sums=True)
    assert triton_ops.gguf_int8_input(data, q4k, 1024, 512) is None        # dequantize + cuBLAS reads x
    x = _x(3, 1024, torch.bfloat16, 1)
    triton_ops.gguf_matmul(x, data, q4k, 1024)
    assert attached(x, sums=False) is None       # a consumer never attaches what it rounded (x may be a graph buffer)


def test_the_runtime_dispatches_the_int8_ops(kernels):
    fused, triton_ops = kernels
    from toolkit.core.registry import default_registry  # noqa: PLC0415
    from toolkit.kernels import runtime  # noqa: PLC0415
    default_registry()
    x = _x(2, 256, torch.bfloat16, 0)
    w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
    assert runtime.resolve("rms_norm_int8", x, w, 1e-6, 0.0, True) is fused.rms_norm_int8
    assert runtime.resolve("add_rms_norm_int8", x, x, w, 1e-6, 0.0, False) is fused.add_rms_norm_int8
    assert runtime.resolve("gated_activation_int8", x, "silu", False) is fused.gated_activation_int8
    data = _packed("Q4_K", 256, 1024, 0)
    assert runtime.resolve("gguf_int8_input", data, 12, 1024, 1) is triton_ops.gguf_int8_input


@pytest.mark.parametrize("tokens", [1, 8, 16])     # 8 and 64 routes: one route per program; 128: int8 route blocks
def test_gguf_moe_reads_attached_blocks_as_its_own(kernels, tokens):
    fused, _ = kernels
    from gguf import GGMLQuantizationType  # noqa: PLC0415
    from toolkit.kernels.gguf_moe import triton_moe  # noqa: PLC0415
    experts, hidden, inter, top_k = 16, 1024, 256, 8
    q4k, q6k = int(GGMLQuantizationType.Q4_K), int(GGMLQuantizationType.Q6_K)
    gate_up, down = _packed("Q4_K", experts * 2 * inter, hidden, 1), _packed("Q6_K", experts * hidden, inter, 2)
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen, device="cuda")[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen, device="cuda")
    request = triton_moe.gguf_moe_int8_input(gate_up, q4k, hidden, tokens * top_k)
    assert request is not None
    x = _x(tokens, hidden, torch.bfloat16, 5)
    normed, *blocks = fused.rms_norm_int8(x, torch.ones(hidden, device="cuda", dtype=torch.bfloat16), 1e-6, 0.0,
                                          request.sums)
    plain = normed.clone()
    attach(normed, *blocks)
    got = triton_moe.gguf_fused_moe(normed, gate_up, q4k, down, q6k, weights, ids)
    assert torch.equal(got, triton_moe.gguf_fused_moe(plain, gate_up, q4k, down, q6k, weights, ids))
