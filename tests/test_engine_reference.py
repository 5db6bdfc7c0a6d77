"""The batched decode path of the reference ``paged_attention`` against the per-sequence definition."""
from __future__ import annotations

import pytest
import torch

from toolkit.core.layers.attention import AttentionMetadata
from toolkit.kernels import reference


def per_sequence(q, k_cache, v_cache, attn, scale, window, softcap):
    """Each sequence's one query against its own gathered context, with the plain ``attend``."""
    block_size, out = k_cache.shape[1], torch.empty_like(q)
    for i, context in enumerate(attn.seq_lens.tolist()):
        blocks = attn.block_tables[i, : -(-context // block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:context]
        v = v_cache[blocks].flatten(0, 1)[:context]
        positions = torch.arange(context)
        out[i:i + 1] = reference.attend(q[i:i + 1], k, v, positions[-1:], positions, scale, window, softcap)
    return out


@pytest.mark.parametrize("heads, kv_heads, window, softcap", [(4, 2, None, None), (6, 1, 5, None), (4, 4, None, 20.0),
                                                              (8, 2, 40, 30.0)])
def test_batched_decode_equals_per_sequence(heads, kv_heads, window, softcap):
    g = torch.Generator().manual_seed(0)
    contexts, block_size, dim = [1, 17, 64, 33, 100], 16, 8
    k_cache = torch.randn(40, block_size, kv_heads, dim, generator=g)
    v_cache = torch.randn(40, block_size, kv_heads, dim, generator=g)
    order = torch.randperm(40, generator=g).tolist()
    tables, used = [], 0
    for context in contexts:
        count = -(-context // block_size)
        tables.append(order[used:used + count] + [-1] * (7 - count))
        used += count
    attn = AttentionMetadata(torch.arange(len(contexts) + 1, dtype=torch.int32), torch.tensor(contexts),
                             torch.zeros(len(contexts), dtype=torch.long), torch.tensor(tables, dtype=torch.int32),
                             max_query_len=1, max_seq_len=max(contexts))
    q = torch.randn(len(contexts), heads, dim, generator=g)
    got = reference.paged_attention(q, k_cache, v_cache, attn, dim ** -0.5, window, softcap)
    torch.testing.assert_close(got, per_sequence(q, k_cache, v_cache, attn, dim ** -0.5, window, softcap))
