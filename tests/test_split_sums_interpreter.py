"""The norm, gated-activation and rotary + KV-store kernels reading split-K partial sums (``toolkit/kernels/fused``:
``add_rms_norm_splits``, ``gated_activation_splits``, ``rotary_store_kv_splits``; ``kernels/split_sums.py``) run by
Triton's interpreter on the CPU.

Oracle: the two-launch path they replace, bit for bit: the separate sum (``triton_reduce.sum_splits``, itself
checked against torch by tests/test_triton_reduce_gpu.py) and then the plain kernel (``add_rms_norm(_int8)``,
``gated_activation(_int8)``, ``(qk_norm_)rotary_store_kv``, checked against the torch references by
tests/test_int8_blocks_interpreter.py and tests/test_fused_qk_norm_interpreter.py); and the torch references of
tests/test_split_sums.py within rounding.

Skipped where Triton is not installed and on CUDA machines; where this process imported Triton compiled
earlier, one test runs this file in a fresh process with the interpreter on (tests/triton_interpreter.py).
"""
from __future__ import annotations

import pytest
import torch

from triton_interpreter import interpreted_fused_ops, rerun_in_fresh_process, start_interpreter

INTERPRETED = start_interpreter("test_fused_kernels.py")
from toolkit.kernels import reference  # noqa: E402

here = pytest.mark.skipif(not INTERPRETED, reason="Triton was imported compiled; run in a fresh process")

if INTERPRETED:
    ops = interpreted_fused_ops()


@pytest.mark.skipif(INTERPRETED, reason="this process runs the tests itself")
def test_in_a_fresh_interpreter_process():
    rerun_in_fresh_process(__file__)


def _parts(seed: int, splits: int, rows: int, cols: int) -> torch.Tensor:
    """Partials whose sum needs its float32 order: large terms that mostly cancel, and small ones."""
    gen = torch.Generator().manual_seed(seed)
    parts = torch.randn(splits, rows, cols, generator=gen)
    parts[0] *= 1000.0
    parts[-1] -= parts[0]
    return parts


def _same(got, want) -> None:
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)


@here
@pytest.mark.parametrize("splits", [2, 3, 8])
@pytest.mark.parametrize("sums", [None, False, True])
@pytest.mark.parametrize("cols", [96, 256])             # 96: a row narrower than the kernel's power-of-two block
def test_norm_adds_the_partials_as_the_two_launches_do(splits, sums, cols):
    parts = _parts(splits + cols, splits, 5, cols)
    gen = torch.Generator().manual_seed(1)
    residual = torch.randn(5, cols, generator=gen).to(torch.float16)
    weight = (torch.rand(cols, generator=gen) + 0.5).to(torch.float16)
    got = ops.add_rms_norm_splits(parts, residual, weight, 1e-6, 0.0, sums)
    x = ops.sum_splits(parts, torch.float16)
    if sums is None:
        want = (*ops.add_rms_norm(x, residual, weight, 1e-6, 0.0), None, None, None)
    else:
        want = ops.add_rms_norm_int8(x, residual, weight, 1e-6, 0.0, sums)
    _same(got, want)
    out, total = reference.add_rms_norm_splits(parts, residual, weight, 1e-6, 0.0, None)[:2]
    torch.testing.assert_close(got[1], total, rtol=0, atol=0)
    torch.testing.assert_close(got[0], out, rtol=2e-3, atol=2e-3)


@here
@pytest.mark.parametrize("splits", [2, 4])
@pytest.mark.parametrize("sums", [None, True])
@pytest.mark.parametrize("cols", [96, 2048 + 64])       # 2,112: two column programs, the second partly masked
def test_gated_activation_adds_the_partials_as_the_two_launches_do(splits, sums, cols):
    """silu (the gelu forms call libdevice, which the interpreter lacks; the GPU tests cover them)."""
    parts = _parts(splits * cols, splits, 3, 2 * cols)
    got = ops.gated_activation_splits(parts, torch.float16, "silu", sums)
    x = ops.sum_splits(parts, torch.float16)
    want = ((ops.gated_activation(x, "silu"), None, None, None) if sums is None
            else ops.gated_activation_int8(x, "silu", sums))
    _same(got, want)
    torch.testing.assert_close(got[0], reference.gated_activation_splits(parts, torch.float16, "silu", None)[0],
                               rtol=2e-3, atol=2e-3)


@here
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (64, 32)])   # 32: features past the rotary part copied
@pytest.mark.parametrize("norm", [None, 0.0, 1.0])                      # q/k norms off, Llama-style, Gemma-style
@pytest.mark.parametrize("v_split", [True, False])   # False: v from another quant type's matmul, a plain tensor
def test_rotary_store_adds_the_partials_as_the_two_launches_do(head_dim, rotary_dim, norm, v_split):
    heads, kv_heads, tokens, dtype = 4, 2, 3, torch.float16
    sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    qkv = _parts(head_dim + rotary_dim, 3, tokens, sum(sizes)) * 0.01   # one fused projection's partials
    q, k, v = qkv.split(sizes, dim=-1)
    if not v_split:
        v = ops.sum_splits(v, dtype).unsqueeze(0)
    gen = torch.Generator().manual_seed(7)
    weights = None if norm is None else (*((1 + 0.3 * torch.randn(head_dim, generator=gen)).to(dtype)
                                           for _ in range(2)), 1e-6, norm)
    positions, slots = torch.tensor([5, 900, 17]), torch.tensor([9, -1, 30])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    mine = [torch.full((4, 16, kv_heads, head_dim), 7.0, dtype=dtype) for _ in range(2)]
    theirs = [cache.clone() for cache in mine]
    got = ops.rotary_store_kv_splits(positions, q, k, v, dtype, inv_freq, head_dim, rotary_dim, *mine, slots,
                                     weights)
    values = [ops.sum_splits(x, dtype) if x.shape[0] > 1 else x[0] for x in (q, k, v)]
    if weights is None:
        want = ops.rotary_store_kv(positions, *values, inv_freq, head_dim, rotary_dim, *theirs, slots)
    else:
        want = ops.qk_norm_rotary_store_kv(positions, *values, *weights, inv_freq, head_dim, rotary_dim, *theirs,
                                           slots)
    assert torch.equal(got, want)
    assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])
    expected = reference.rotary_store_kv_splits(positions, q, k, v, dtype, inv_freq, head_dim, rotary_dim,
                                                *[c.clone() for c in theirs], slots, weights)
    torch.testing.assert_close(got, expected, rtol=4e-3, atol=4e-3)
