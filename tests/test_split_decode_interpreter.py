"""The split-context decode attention kernel (``toolkit/kernels/attention/triton_decode.py``) run by Triton's
interpreter on the CPU, against the torch reference ``reference.paged_attention`` in float32: GQA, MHA, MQA,
an odd head dimension, a sliding window, a softcap, a padding row (no context), contexts shorter and longer
than a slice, and the counters left at zero for the next launch; and the output's int8 blocks the combining program
writes for the output projection, the output's rounding (``int8_checks.assert_blocks``). tests/test_engine_gpu.py
checks the compiled kernel (through the dispatch) on a GPU.

Skipped where Triton is not installed and on CUDA machines; where this process imported Triton compiled
earlier, one test runs this file in a fresh process with the interpreter on (tests/triton_interpreter.py).
"""
from __future__ import annotations

import pytest
import torch

from int8_checks import assert_blocks
from triton_interpreter import interpreted_modules, rerun_in_fresh_process, start_interpreter

INTERPRETED = start_interpreter("test_engine_gpu.py")
from toolkit.core.layers.attention import AttentionMetadata  # noqa: E402
from toolkit.kernels import reference  # noqa: E402

here = pytest.mark.skipif(not INTERPRETED, reason="Triton was imported compiled; run in a fresh process")

if INTERPRETED:
    ops = interpreted_modules("toolkit.kernels.triton_int8", "toolkit.kernels.attention.triton_decode",
                              "toolkit.kernels.attention.ops")[-1]


@pytest.mark.skipif(INTERPRETED, reason="this process runs the tests itself")
def test_in_a_fresh_interpreter_process():
    rerun_in_fresh_process(__file__)


CASES = [  # heads, kv_heads, head_dim, contexts (one new token each, already in the cache), window, softcap
    (8, 2, 64, [130, 1, 17, 300], None, None),      # GQA, a context shorter than one slice
    (4, 4, 32, [33, 0, 64], None, None),            # MHA; a padding row without context
    (6, 1, 80, [90, 50], 7, None),                  # MQA, odd head dim, sliding window
    (4, 2, 16, [100, 45], 32, 50.0),                # window and softcap
]


def make_case(heads, kv_heads, head_dim, contexts, dtype, block_size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-c // block_size) for c in contexts) + 3
    order = torch.randperm(num_blocks, generator=g).tolist()
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    tables, used = [], 0
    for context in contexts:
        count = -(-context // block_size)
        tables.append(order[used:used + count])
        used += count
    width = max(1, max(len(t) for t in tables))
    block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    starts = torch.arange(len(contexts) + 1, dtype=torch.int32)
    seq_lens = torch.tensor(contexts, dtype=torch.int32)
    q = torch.randn(len(contexts), heads, head_dim, generator=g).to(dtype)
    return q, k_cache, v_cache, AttentionMetadata(starts, seq_lens, None, block_tables, 1, max(contexts))


@here
@pytest.mark.parametrize("splits", [2, 4, 16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"h{c[0]}-kv{c[1]}-d{c[2]}")
def test_split_decode_matches_reference(case, splits):
    heads, kv_heads, head_dim, contexts, window, softcap = case
    q, k_cache, v_cache, attn = make_case(heads, kv_heads, head_dim, contexts, torch.float32)
    ops._COUNTS.clear()
    got = ops._split_decode(q, k_cache, v_cache, attn.query_start_loc, attn.seq_lens, attn.block_tables,
                            head_dim ** -0.5, window or 0, softcap or 0.0, splits)
    real = attn.seq_lens > 0
    keep = real.nonzero().flatten()
    trimmed = AttentionMetadata(torch.arange(len(keep) + 1, dtype=torch.int32), attn.seq_lens[keep], None,
                                attn.block_tables[keep], 1, attn.max_seq_len)
    expected = reference.paged_attention(q[keep], k_cache, v_cache, trimmed, head_dim ** -0.5, window, softcap)
    torch.testing.assert_close(got[keep], expected, atol=1e-4, rtol=1e-4)
    assert torch.all(got[~real] == 0), "a sequence without context attends to nothing"
    assert torch.all(ops._COUNTS[q.device] == 0), "every combining program zeroes its counter again"


@here
@pytest.mark.parametrize("sums", [False, True])
@pytest.mark.parametrize("case", [c for c in CASES if c[2] in (32, 64)], ids=lambda c: f"h{c[0]}-kv{c[1]}-d{c[2]}")
def test_split_decode_writes_the_output_int8_blocks(case, sums):
    heads, kv_heads, head_dim, contexts, window, softcap = case
    q, k_cache, v_cache, attn = make_case(heads, kv_heads, head_dim, contexts, torch.float16, seed=3)
    width = heads * head_dim
    blocks = (torch.zeros(len(contexts), width // 4, dtype=torch.int32),
              torch.zeros(len(contexts), width // 32), torch.zeros(len(contexts), width // 32) if sums else None)
    args = (q, k_cache, v_cache, attn.query_start_loc, attn.seq_lens, attn.block_tables, head_dim ** -0.5,
            window or 0, softcap or 0.0, 4)
    ops._COUNTS.clear()
    got = ops._split_decode(*args, blocks)
    assert torch.equal(got, ops._split_decode(*args))          # the output as without the blocks
    real = (attn.seq_lens > 0).nonzero().flatten()       # a padding row's output and blocks are never read
    assert_blocks((blocks[0][real], blocks[1][real], None if blocks[2] is None else blocks[2][real]),
                  got[real].reshape(len(real), width), sums)


@here
def test_dispatch_splits_only_small_decode_batches(monkeypatch):
    """The dispatch's slice count: a power of two, more for fewer sequences, 1 once they fill the GPU, and
    bounded by what the combining program holds."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(ops, "num_sms", lambda device: 132)              # an H100's SMs
    assert ops.decode_splits(1, 8, 4, 128, cpu) == 16
    assert ops.decode_splits(8, 8, 4, 128, cpu) == 4
    assert ops.decode_splits(32, 8, 4, 128, cpu) == 1
    assert ops.decode_splits(1, 8, 8, 256, cpu) == 4                  # 8 rows x 256 dims: 4 slices fill 8192
    assert ops.decode_splits(1, 8, 16, 256, cpu) == 2
    assert ops.decode_splits(1, 2, 16, 128, cpu) == 4
    monkeypatch.setenv("TOOLKIT_DECODE_SPLITS", "1")
    assert ops.decode_splits(1, 8, 4, 128, cpu) == 1
