"""The compiled CPU decoder-layer ops (toolkit/kernels/cpu_fused) against the torch references.

The references in toolkit/kernels/reference.py are the oracle (they are independent torch code
and are themselves tested against transformers through the model tests); each compiled op must
match them to float32 rounding, and must decline what it does not handle.
"""
from __future__ import annotations

import pytest
import torch

from toolkit.core.layers import AttentionMetadata
from toolkit.kernels import reference, runtime
from toolkit.kernels.cpu_fused import ops

pytestmark = pytest.mark.skipif(ops.EXTENSION.get() is None, reason="no C++ toolchain to build the CPU kernels")
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(1, 640), (3, 4, 256), (2, 37)])
def test_rms_norm_matches_reference(shape, offset):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(*shape, generator=g) * 3, torch.randn(shape[-1], generator=g)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6, offset), reference.rms_norm(x, w, 1e-6, offset), **TOL)
    r = torch.randn(*shape, generator=g)
    normed, total = ops.add_rms_norm(x, r, w, 1e-6, offset)
    ref_normed, ref_total = reference.add_rms_norm(x, r, w, 1e-6, offset)
    torch.testing.assert_close(total, ref_total, rtol=0, atol=0)
    torch.testing.assert_close(normed, ref_normed, **TOL)


def test_rms_norm_takes_a_strided_view():
    x = torch.randn(4, 2, 64)[:, 1]
    w = torch.randn(64)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5), **TOL)


@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_rotary_qk_matches_reference(rotary_dim):
    g = torch.Generator().manual_seed(1)
    head_dim, tokens = 64, 5
    qkv = torch.randn(tokens, (4 + 2 + 2) * head_dim, generator=g)
    q, k = qkv[:, : 4 * head_dim], qkv[:, 4 * head_dim: 6 * head_dim]  # row-strided slices, as from qkv_proj
    positions = torch.tensor([0, 1, 7, 300, 40_000])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    got = ops.rotary_qk(positions, q, k, inv_freq, head_dim, rotary_dim)
    want = reference.rotary_qk(positions, q, k, inv_freq, head_dim, rotary_dim)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("activation", sorted(ops.ACTIVATIONS))
def test_gated_activation_matches_reference(activation):
    x = torch.randn(3, 2 * 96, generator=torch.Generator().manual_seed(2)) * 4
    torch.testing.assert_close(ops.gated_activation(x, activation), reference.gated_activation(x, activation), **TOL)
    # a width off the 8-lane vector (scalar tail) and gates far out (the vector exp's input clamp)
    x = torch.randn(2, 2 * 101, generator=torch.Generator().manual_seed(3)) * 4
    x[0, :6] = torch.tensor([-100.0, -90.0, -30.0, 30.0, 90.0, 100.0])
    torch.testing.assert_close(ops.gated_activation(x, activation), reference.gated_activation(x, activation), **TOL)


def _cache_and_meta(context: list[int], query: list[int], block_size=4, kv_heads=2, dim=16, table_dtype=torch.int32):
    """Caches holding random K/V for each sequence in shuffled blocks, and the metadata of a step."""
    g = torch.Generator().manual_seed(3)
    blocks_per = [(c + block_size - 1) // block_size for c in context]
    perm = torch.randperm(sum(blocks_per) + 2, generator=g)
    tables = torch.full((len(context), max(blocks_per)), -1, dtype=table_dtype)
    used = 0
    for i, count in enumerate(blocks_per):
        tables[i, :count] = perm[used: used + count]
        used += count
    shape = (sum(blocks_per) + 2, block_size, kv_heads, dim)
    k_cache, v_cache = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    starts = torch.tensor([0, *query]).cumsum(0).to(torch.int32)
    meta = AttentionMetadata(starts, torch.tensor(context, dtype=torch.int32), block_tables=tables,
                             max_query_len=max(query), max_seq_len=max(context))
    return k_cache, v_cache, meta


@pytest.mark.parametrize("window,softcap", [(None, None), (3, None), (None, 20.0)])
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_paged_attention_decode_and_prefill_match_reference(window, softcap, table_dtype):
    heads, dim = 4, 16
    for context, query in (([9, 1, 14], [1, 1, 1]), ([9, 6], [3, 6])):  # decode batch; prefill with cached prefix
        k_cache, v_cache, meta = _cache_and_meta(context, query, table_dtype=table_dtype)
        q = torch.randn(sum(query), heads, dim, generator=torch.Generator().manual_seed(4))
        got = ops.paged_attention(q, k_cache, v_cache, meta, 0.25, window, softcap)
        want = reference.paged_attention(q, k_cache, v_cache, meta, 0.25, window, softcap)
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("dim,kv_heads", [(80, 1), (256, 2)])
def test_paged_attention_wide_heads_match_reference(dim, kv_heads):
    """Head sizes that reach the vector paths (64-wide output blocks, 32-wide dots) and their tails
    (80 = 64 + 16), four query heads per KV head, a 40-token prefill after a 9-token prefix."""
    k_cache, v_cache, meta = _cache_and_meta([49, 3], [40, 1], block_size=8, kv_heads=kv_heads, dim=dim)
    q = torch.randn(41, 4 * kv_heads, dim, generator=torch.Generator().manual_seed(6))
    for window in (None, 7):
        got = ops.paged_attention(q, k_cache, v_cache, meta, dim ** -0.5, window, None)
        want = reference.paged_attention(q, k_cache, v_cache, meta, dim ** -0.5, window, None)
        torch.testing.assert_close(got, want, **TOL)


def test_store_kv_matches_reference():
    g = torch.Generator().manual_seed(5)
    kv = torch.randn(3, 2 * 2 * 8, generator=g)
    k, v = kv[:, :16].view(3, 2, 8), kv[:, 16:].view(3, 2, 8)  # row-strided views
    slots = torch.tensor([5, -1, 2])
    mine = [torch.zeros(2, 4, 2, 8) for _ in range(2)]
    theirs = [torch.zeros(2, 4, 2, 8) for _ in range(2)]
    ops.store_kv(k, v, *mine, slots)
    reference.store_kv(k, v, *theirs, slots)
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rotary_store_kv_matches_reference_and_is_dispatched():
    """The composed op (the compiled rotary, then the compiled store) on slices of one qkv output."""
    g = torch.Generator().manual_seed(6)
    head_dim, tokens = 16, 4
    qkv = torch.randn(tokens, (2 + 1 + 1) * head_dim, generator=g)
    q, k, v = qkv[:, :32], qkv[:, 32:48], qkv[:, 48:]
    positions, slots, inv_freq = torch.tensor([3, 0, 9, 500]), torch.tensor([6, -1, 0, 3]), torch.rand(4)
    mine = [torch.zeros(2, 4, 1, head_dim) for _ in range(2)]
    theirs = [torch.zeros(2, 4, 1, head_dim) for _ in range(2)]
    args = (positions, q, k, v, inv_freq, head_dim, 8)
    assert runtime.resolve("rotary_store_kv", *args, *mine, slots) is ops.rotary_store_kv
    torch.testing.assert_close(ops.rotary_store_kv(*args, *mine, slots),
                               reference.rotary_store_kv(*args, *theirs, slots), rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(mine[0], theirs[0], rtol=1e-5, atol=2e-5)
    assert torch.equal(mine[1], theirs[1]) and mine[1].abs().sum() > 0


def test_registered_for_cpu_and_declines_other_dtypes():
    x, w = torch.randn(2, 8), torch.randn(8)
    assert runtime.resolve("rms_norm", x, w, 1e-6, 0.0) is ops.rms_norm
    assert runtime.resolve("rms_norm", x.double(), w.double(), 1e-6, 0.0) is reference.rms_norm
    assert runtime.resolve("gated_activation", torch.randn(2, 8), "relu2") is reference.gated_activation
    positions = torch.arange(2, dtype=torch.int32)  # the kernel reads int64 positions only
    assert runtime.resolve("rotary_qk", positions, x, x, torch.ones(4), 8, 8) is reference.rotary_qk


def test_paged_attention_chunks_claimed_by_two_threads_match_reference():
    """Two threads claim the (token, kv head) chunks from a shared counter, longest context first:
    a 64-token prefill after a 30-token prefix and a second sequence give several chunks of both."""
    k_cache, v_cache, meta = _cache_and_meta([94, 5], [64, 5], block_size=8, kv_heads=2, dim=256)
    q = torch.randn(69, 8, 256, generator=torch.Generator().manual_seed(7))
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = ops.paged_attention(q, k_cache, v_cache, meta, 256 ** -0.5, None, None)
    finally:
        torch.set_num_threads(previous)
    torch.testing.assert_close(got, reference.paged_attention(q, k_cache, v_cache, meta, 256 ** -0.5, None, None), **TOL)
