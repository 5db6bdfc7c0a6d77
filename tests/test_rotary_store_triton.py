"""The rotary Triton kernel (``kernels/fused/triton_kernels.py: rotary_heads_kernel``) run by
Triton's interpreter on the CPU, against the torch references: ``rotary_store_kv`` (rotary of q
and k, then k and v written into a paged KV cache, one kernel) and ``rotary_qk`` (the same kernel
writing k to a plain output). Tiny shapes: the interpreter runs every program in numpy.

Skipped where Triton is not installed and on CUDA machines, where tests/test_fused_kernels.py
checks the compiled kernels. The interpreter switch is read when ``@triton.jit`` decorates, so it
must be set before Triton is first imported: where this process imported Triton earlier (a run of
several files), one test runs this file in a fresh process instead.

Tolerances: the reference rounds cos/sin and every product to the activation dtype (as
transformers does); the kernel computes in float32 and rounds once. float32 agrees to ~1e-6;
float16 to its rounding. v and the pass-through features are copies and must be exact.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from triton_interpreter import rerun_in_fresh_process, start_interpreter
from toolkit.kernels import reference

INTERPRETED = start_interpreter("test_fused_kernels.py")
here = pytest.mark.skipif(not INTERPRETED, reason="Triton was imported compiled; run in a fresh process")
if INTERPRETED:
    # The interpreter has no libdevice (its functions are stubs returning None there): the kernel's
    # libdevice.cos/sin become numpy's. This checks the kernel's indexing, masks and arithmetic; the
    # GPU tests (test_fused_kernels.py) check it compiled, with libdevice.
    import triton.language as tl  # noqa: E402
    from triton.language.extra import libdevice  # noqa: E402
    libdevice.cos, libdevice.sin = (lambda x: tl.math.cos(x)), (lambda x: tl.math.sin(x))
    ops = importlib.import_module("toolkit.kernels.fused.ops")
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=4e-3)}
SENTINEL = 7.0  # cache entries no token writes must keep it


@pytest.mark.skipif(INTERPRETED, reason="this process runs the tests itself")
def test_in_a_fresh_interpreter_process():
    rerun_in_fresh_process(__file__)


def _inputs(tokens: int, heads: int, kv_heads: int, head_dim: int, rotary_dim: int, dtype: torch.dtype, seed: int):
    """q, k, v as row-strided views of one fused qkv output (as the attention layer gets them)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    positions = torch.randint(0, 9000, (tokens,), generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    return positions, q, k, v, inv_freq


def _caches(blocks: int, page: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    return [torch.full((blocks, page, kv_heads, head_dim), SENTINEL, dtype=dtype) for _ in range(2)]


@here
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary_dim", [(4, 2, 16, 16), (2, 1, 20, 8), (3, 3, 12, 12)])
def test_rotary_store_kv_matches_rotary_then_store(dtype, heads, kv_heads, head_dim, rotary_dim):
    """Partial rotary (8 of 20), a head size that is no power of two, padding slots (-1) skipped,
    slots in several pages and out of order."""
    positions, q, k, v, inv_freq = _inputs(5, heads, kv_heads, head_dim, rotary_dim, dtype, seed=head_dim)
    slots = torch.tensor([9, -1, 2, 4, -1])
    mine, theirs = _caches(3, 4, kv_heads, head_dim, dtype), _caches(3, 4, kv_heads, head_dim, dtype)
    q_rot = ops._rotary_store_kv(positions, q, k, v, inv_freq, head_dim, rotary_dim, *mine, slots)
    ref_q = reference.rotary_store_kv(positions, q, k, v, inv_freq, head_dim, rotary_dim, *theirs, slots)
    torch.testing.assert_close(q_rot, ref_q, **TOL[dtype])
    torch.testing.assert_close(mine[0], theirs[0], **TOL[dtype])
    assert torch.equal(mine[1], theirs[1])  # v: a copy
    written = torch.zeros(12, dtype=torch.bool)
    written[[9, 2, 4]] = True
    assert (mine[0].view(12, -1)[~written] == SENTINEL).all() and (mine[1].view(12, -1)[~written] == SENTINEL).all()
    if rotary_dim < head_dim:  # pass-through features of the cached k are k's own
        cached = mine[0].view(12, kv_heads, head_dim)[2, :, rotary_dim:]
        assert torch.equal(cached, k[2].view(kv_heads, head_dim)[:, rotary_dim:])


@here
def test_rotary_store_kv_casts_into_a_cache_of_another_dtype():
    """float32 activations into a float16 cache: rounded as the reference's store rounds them."""
    positions, q, k, v, inv_freq = _inputs(3, 2, 1, 16, 16, torch.float32, seed=3)
    slots = torch.tensor([0, 5, 3])
    mine, theirs = _caches(2, 4, 1, 16, torch.float16), _caches(2, 4, 1, 16, torch.float16)
    ops._rotary_store_kv(positions, q, k, v, inv_freq, 16, 16, *mine, slots)
    reference.rotary_store_kv(positions, q, k, v, inv_freq, 16, 16, *theirs, slots)
    torch.testing.assert_close(mine[0], theirs[0], **TOL[torch.float16])
    assert torch.equal(mine[1], theirs[1])


@here
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary_dim", [(4, 2, 16, 16), (2, 1, 20, 8)])
def test_rotary_qk_matches_reference(heads, kv_heads, head_dim, rotary_dim):
    positions, q, k, _, inv_freq = _inputs(4, heads, kv_heads, head_dim, rotary_dim, torch.float32, seed=11)
    out_q, out_k = ops.rotary_qk(positions, q, k, inv_freq, head_dim, rotary_dim)
    ref_q, ref_k = reference.rotary_qk(positions, q, k, inv_freq, head_dim, rotary_dim)
    torch.testing.assert_close(out_q, ref_q, **TOL[torch.float32])
    torch.testing.assert_close(out_k, ref_k, **TOL[torch.float32])
