"""The fused q/k-norm + rotary + KV-store kernel (``toolkit/kernels/fused``, ``qk_norm_rotary_store_kv``) run
by Triton's interpreter on the CPU, against the torch references composed by hand: ``reference.rms_norm`` on
every q and k head, then ``reference.rotary_store_kv``. tests/test_fused_kernels.py checks the compiled
kernel (bfloat16 too) on a GPU.

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


def _by_hand(positions, q, k, v, q_weight, k_weight, eps, offset, inv_freq, head_dim, rotary_dim, caches, slots):
    tokens = q.shape[0]
    q = reference.rms_norm(q.reshape(tokens, -1, head_dim), q_weight, eps, offset).reshape(tokens, -1)
    k = reference.rms_norm(k.reshape(tokens, -1, head_dim), k_weight, eps, offset).reshape(tokens, -1)
    return reference.rotary_store_kv(positions, q, k, v, inv_freq, head_dim, rotary_dim, *caches, slots)


@here
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.float16, 4e-3)])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (64, 32)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_norm_rotary_and_store_in_one_kernel(dtype, tolerance, head_dim, rotary_dim, offset):
    """On views of a fused qkv row (as the model passes them): rotated normalised q returned, rotated
    normalised k and plain v in the paged caches, a padding slot (-1) writing nothing."""
    heads, kv_heads, tokens = 4, 2, 3
    gen = torch.Generator().manual_seed(head_dim + rotary_dim + int(offset))
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen) * 3).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q_weight, k_weight = ((1 + 0.3 * torch.randn(head_dim, generator=gen)).to(dtype) for _ in range(2))
    positions = torch.tensor([5, 900, 17])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    slots = torch.tensor([9, -1, 30])
    mine = [torch.full((4, 16, kv_heads, head_dim), 7.0, dtype=dtype) for _ in range(2)]
    theirs = [cache.clone() for cache in mine]
    args = (positions, q, k, v, q_weight, k_weight, 1e-6, offset, inv_freq, head_dim, rotary_dim)
    got = ops.qk_norm_rotary_store_kv(*args, *mine, slots)
    expected = _by_hand(*args, theirs, slots)
    for out, ref in ((got, expected), (mine[0], theirs[0])):
        error = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
        assert error < tolerance, error
    assert torch.equal(mine[1], theirs[1])                          # v is copied, never normalised
    assert (mine[0].view(64, -1)[[i for i in range(64) if i not in (9, 30)]] == 7.0).all()  # slot -1: nothing
    unnormalised = reference.rotary_store_kv(positions, q, k, v, inv_freq, head_dim, rotary_dim,
                                             *[c.clone() for c in theirs], slots)
    assert not torch.allclose(got, unnormalised, atol=1e-2)          # the norms changed the result


@here
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (64, 32)])
def test_rotary_store_without_norms_shares_the_launch(head_dim, rotary_dim):
    """``rotary_store_kv`` goes through the same launch with the norm off: the reference's values."""
    heads, kv_heads, tokens = 4, 2, 3
    gen = torch.Generator().manual_seed(head_dim + rotary_dim)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    positions, slots = torch.tensor([5, 900, 17]), torch.tensor([9, -1, 30])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    mine = [torch.full((4, 16, kv_heads, head_dim), 7.0) for _ in range(2)]
    theirs = [cache.clone() for cache in mine]
    args = (positions, q, k, v, inv_freq, head_dim, rotary_dim)
    got = ops.rotary_store_kv(*args, *mine, slots)
    expected = reference.rotary_store_kv(*args, *theirs, slots)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine[0], theirs[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(mine[1], theirs[1])
