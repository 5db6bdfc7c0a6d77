"""On a CUDA device: Triton paged attention and KV store against the torch references, CUDA graphs
against eager decode, and the engine against transformers. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

import toolkit
from toolkit import LLM, SamplingParams
from toolkit.core.layers.attention import AttentionMetadata
from toolkit.kernels import reference, runtime

pytestmark = pytest.mark.gpu

CASES = [  # heads, kv_heads, head_dim, [(context, new tokens) per sequence], sliding window, softcap
    (4, 2, 64, [(5, 5), (37, 1), (70, 20), (16, 16), (200, 64)], None, None),   # prefill over cached prefix
    (12, 4, 64, [(130, 1), (1, 1), (17, 1), (300, 1)], None, None),             # decode, GQA
    (8, 8, 128, [(33, 1), (64, 64), (0, 1)], None, None),                       # MHA; an empty padding row
    (8, 1, 80, [(90, 90), (50, 3)], 7, None),                                   # MQA, odd head dim, window
    (4, 2, 256, [(40, 40), (129, 1)], None, 30.0),                              # Gemma-like: 256 dims, softcap
    (16, 2, 16, [(100, 1), (45, 45)], 32, 50.0),
    # decode batches small enough for the split-context kernel (kernels/attention/triton_decode.py)
    (8, 2, 128, [(500, 1), (0, 1), (64, 1)], None, None),                        # long context, a padding row
    (4, 2, 256, [(129, 1), (3, 1)], 16, 30.0),                                  # 256 dims, window, softcap
    (32, 8, 64, [(1000, 1)], None, None),                                       # batch 1, 16 slices
]


def make_case(heads, kv_heads, head_dim, ctx_q, dtype, block_size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-c // block_size) for c, _ in ctx_q) + 5
    order = torch.randperm(num_blocks, generator=g).tolist()
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to("cuda", dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to("cuda", dtype)
    tables, used = [], 0
    for context, _ in ctx_q:
        count = -(-context // block_size)
        tables.append(order[used:used + count])
        used += count
    width = max(1, max(len(t) for t in tables))
    block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32, device="cuda")
    query_lens = [q for _, q in ctx_q]
    starts = torch.tensor([0] + query_lens).cumsum(0).to(device="cuda", dtype=torch.int32)
    seq_lens = torch.tensor([c for c, _ in ctx_q], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(query_lens), heads, head_dim, generator=g).to("cuda", dtype)
    attn = AttentionMetadata(starts, seq_lens, None, block_tables, max(query_lens), max(c for c, _ in ctx_q))
    return q, k_cache, v_cache, attn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"h{c[0]}-kv{c[1]}-d{c[2]}")
def test_triton_paged_attention_matches_reference(case, dtype):
    heads, kv_heads, head_dim, ctx_q, window, softcap = case
    q, k_cache, v_cache, attn = make_case(heads, kv_heads, head_dim, ctx_q, dtype)
    impl = runtime.resolve("paged_attention", q, k_cache, v_cache, attn, head_dim ** -0.5, window, softcap)
    assert impl is not reference.paged_attention, "the Triton kernel should serve CUDA tensors"
    got = impl(q, k_cache, v_cache, attn, head_dim ** -0.5, window, softcap)
    # the oracle, in float32, over the real sequences (an empty padding row must come out as zeros)
    real = (attn.seq_lens > 0).repeat_interleave(attn.query_start_loc.diff().long())
    expected = reference.paged_attention(q.float()[real], k_cache.float(), v_cache.float(), without_empty(attn),
                                         head_dim ** -0.5, window, softcap)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 5e-3 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(got.float()[real], expected, atol=tolerance, rtol=tolerance)
    assert torch.all(got[~real] == 0)


@pytest.mark.parametrize("splits", [1, 2, 16])
def test_split_decode_in_a_cuda_graph_follows_the_context(splits, monkeypatch):
    """The split-context decode kernel at 1, 2 and 16 slices, captured once and replayed as the context
    grows (the slices are cut from the lengths on the GPU; the counters must be back at zero after every
    launch), against the reference each time."""
    from toolkit.kernels.attention import ops  # noqa: PLC0415

    monkeypatch.setenv("TOOLKIT_DECODE_SPLITS", str(splits))
    q, k_cache, v_cache, attn = make_case(32, 8, 128, [(700, 1), (5, 1)], torch.bfloat16)
    assert ops.decode_splits(2, 8, 4, 128, q.device) == splits
    impl = runtime.resolve("paged_attention", q, k_cache, v_cache, attn, 128 ** -0.5, None, None)
    impl(q, k_cache, v_cache, attn, 128 ** -0.5, None, None)             # the counters exist before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = impl(q, k_cache, v_cache, attn, 128 ** -0.5, None, None)
    for lengths in ([700, 5], [37, 1], [704, 16]):
        attn.seq_lens.copy_(torch.tensor(lengths))
        graph.replay()
        expected = reference.paged_attention(q.float(), k_cache.float(), v_cache.float(), attn, 128 ** -0.5)
        torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)
    if splits > 1:
        assert int(ops._COUNTS[q.device].abs().sum()) == 0


@pytest.mark.parametrize("sums", [False, True])
@pytest.mark.parametrize("case", [c for c in CASES if all(n == 1 for _, n in c[3])], ids=lambda c: f"h{c[0]}-d{c[2]}")
def test_split_decode_writes_the_output_int8_blocks(case, sums):
    """``paged_attention_int8``: a decode batch the split kernel serves gets its output's int8 blocks from the
    same launch, that output's rounding (``int8_checks.assert_blocks``); the output equals ``paged_attention``'s."""
    from int8_checks import assert_blocks  # noqa: PLC0415

    heads, kv_heads, head_dim, ctx_q, window, softcap = case
    q, k_cache, v_cache, attn = make_case(heads, kv_heads, head_dim, ctx_q, torch.bfloat16, seed=4)
    args = (q, k_cache, v_cache, attn, head_dim ** -0.5, window, softcap)
    impl = runtime.resolve("paged_attention_int8", *args, sums)
    assert impl is not reference.paged_attention_int8, "the Triton kernel should serve CUDA tensors"
    out, words, scales, block_sums = impl(*args, sums)
    assert torch.equal(out, runtime.call("paged_attention", *args))
    real = attn.seq_lens > 0                                 # a padding row's output and blocks are never read
    assert_blocks((words[real], scales[real], None if block_sums is None else block_sums[real]),
                  out[real].reshape(int(real.sum()), -1), sums)


def without_empty(attn: AttentionMetadata) -> AttentionMetadata:
    keep = attn.seq_lens > 0
    query_lens = attn.query_start_loc.diff()[keep]
    starts = torch.cat([query_lens.new_zeros(1), query_lens.cumsum(0)]).to(torch.int32)
    return AttentionMetadata(starts, attn.seq_lens[keep], None, attn.block_tables[keep], attn.max_query_len,
                             attn.max_seq_len)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_store_kv_matches_reference(dtype):
    g = torch.Generator().manual_seed(1)
    k = torch.randn(40, 3, 64, generator=g).to("cuda", dtype)
    v = torch.randn(40, 3, 64, generator=g).to("cuda", dtype)
    slots = torch.randperm(10 * 16, generator=g)[:40].to("cuda")
    slots[::7] = -1
    caches = [torch.zeros(10, 16, 3, 64, dtype=dtype, device="cuda") for _ in range(4)]
    reference.store_kv(k, v, caches[0], caches[1], slots)
    impl = runtime.resolve("store_kv", k, v, caches[2], caches[3], slots)
    assert impl is not reference.store_kv
    impl(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_kernels_are_torch_custom_ops():
    k, cache = torch.zeros(1, 1, 8, device="cuda"), torch.zeros(1, 16, 1, 8, device="cuda")
    slots = torch.zeros(1, dtype=torch.long, device="cuda")
    runtime.resolve("store_kv", k, k, cache, cache, slots)  # the first dispatch imports the kernels' module
    assert hasattr(torch.ops.toolkit, "paged_attention") and hasattr(torch.ops.toolkit, "store_kv")


@pytest.fixture(scope="module")
def cuda_model(tiny_llama):
    return toolkit.load(tiny_llama.path, device="cuda", dtype="fp32")


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in lengths]


def test_cuda_graph_decode_equals_eager_and_transformers(cuda_model, tiny_llama):
    batch = prompts([3, 17, 40, 64, 5, 33, 1, 100, 9])
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    graphed = LLM(cuda_model, max_num_seqs=16, max_num_batched_tokens=64)
    graphs = graphed.executor.runner.graphs
    assert graphs is not None and graphs.batch_sizes == [1, 2, 4, 8, 16]
    with_graphs = [o.token_ids for o in graphed.generate(batch, params)]
    eager = [o.token_ids for o in LLM(cuda_model, max_num_seqs=16, max_num_batched_tokens=64,
                                      enforce_eager=True).generate(batch, params)]
    assert with_graphs == eager
    reference_model = tiny_llama.reference.to("cuda")
    try:
        for prompt, tokens in zip(batch, with_graphs):
            ids = torch.tensor([prompt], device="cuda")
            for _ in range(12):
                ids = torch.cat([ids, reference_model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            assert tokens == ids[0, len(prompt):].tolist()
    finally:
        tiny_llama.reference.to("cpu")


def test_qwen3_qk_norms_fused_into_rotary_decode_as_transformers(tmp_path):
    """Qwen3's q/k norms run inside the rotary + KV-store kernel on CUDA (``qk_norm_rotary_store_kv``): the
    engine's greedy tokens (graphs, running ahead) equal transformers' own greedy decoding, in float32."""
    from hf_fixtures import save_hf_model  # noqa: PLC0415
    from toolkit.kernels import runtime  # noqa: PLC0415

    reference_model = save_hf_model(tmp_path, "qwen3").to("cuda").float()
    model = toolkit.load(tmp_path, device="cuda", dtype="fp32")
    calls = []
    resolve = runtime.resolve
    batch = prompts([5, 30, 1, 64], seed=7)
    try:  # spied from before the engine captures its graphs
        runtime.resolve = lambda name, *a, **k: calls.append(name) or resolve(name, *a, **k)
        llm = LLM(model, max_num_seqs=8)
        assert llm.executor.runner.graphs is not None
        tokens = [o.token_ids for o in llm.generate(batch, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))]
    finally:
        runtime.resolve = resolve
    assert "qk_norm_rotary_store_kv" in calls
    for prompt, got in zip(batch, tokens):
        ids = torch.tensor([prompt], device="cuda")
        for _ in range(10):
            ids = torch.cat([ids, reference_model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert got == ids[0, len(prompt):].tolist()


def test_run_ahead_equals_the_synchronous_engine_on_cuda(cuda_model):
    """Graph replays launched from the step before's sampled ids on the device (engine/run_ahead.py),
    with sequences ending by length and by stop ids at different steps (the gathered-rows path)."""
    batch = prompts([3, 17, 40, 64, 5, 33, 1, 100, 9], seed=2)
    greedy = LLM(cuda_model, max_num_seqs=16, run_ahead=False).generate(
        batch, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    stop_ids = [out.token_ids[5] for out in greedy[:2]]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (1, 3, 8, 16, 16)]
    params += [SamplingParams(max_tokens=16, temperature=0, stop_token_ids=stop_ids)] * 2
    params += [SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9, seed=4, ignore_eos=True)] * 2
    expected = [(o.token_ids, o.finish_reason) for o in
                LLM(cuda_model, max_num_seqs=16, run_ahead=False).generate(batch, params)]
    llm = LLM(cuda_model, max_num_seqs=16, run_ahead=True)
    ahead = []
    schedule_ahead = llm.scheduler.schedule_ahead
    llm.scheduler.schedule_ahead = lambda items: ahead.append(len(items)) or schedule_ahead(items)
    assert [(o.token_ids, o.finish_reason) for o in llm.generate(batch, params)] == expected
    assert len(ahead) > 8 and len(set(ahead)) > 2  # ran ahead, on shrinking subsets of the batch
    assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]


def test_seeded_sampling_on_cuda_is_reproducible(cuda_model):
    params = SamplingParams(max_tokens=10, temperature=1.0, top_k=50, seed=5, ignore_eos=True)
    llm = LLM(cuda_model, max_num_seqs=8)
    first = llm.generate(prompts([10])[0], params)[0].token_ids
    mixed = llm.generate(prompts([4, 10, 20], seed=0)[:1] + prompts([10]) + prompts([20], seed=3),
                         [SamplingParams(max_tokens=10, temperature=1.0), params, SamplingParams(max_tokens=10)])
    assert mixed[1].token_ids == first


def test_prefill_graphs_equal_eager_prefill_and_mixed_steps(cuda_model):
    """Prefill and mixed steps replayed from lazily captured (tokens, sequences) buckets give the
    eager step's logits; each step is run eagerly first, and the graph rewrites the same KV."""
    from toolkit.core.engine.model_runner import StepInput  # noqa: PLC0415

    llm = LLM(cuda_model, max_num_seqs=8, max_num_batched_tokens=256)
    runner = llm.executor.runner
    assert runner.prefill_graphs is not None
    a, b, c = prompts([38, 50, 36], seed=7)
    tables = [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]  # blocks of 16 tokens, disjoint per sequence
    steps = [  # A's prompt and C's first 16 tokens; then A decodes, B's whole prompt, C's next 20
        StepInput(a[:37] + c[:16], [37, 16], [0, 0], [tables[0], tables[2]], [0, 1]),
        StepInput([a[37]] + b + c[16:], [1, 50, 20], [37, 0, 16], tables, [0, 1, 2]),
        StepInput(b[:5], [5], [0], [tables[1]], [0]),
    ]
    for step, bucket in zip(steps, [(64, 2), (128, 4), (16, 1)]):
        eager = runner.execute(step, graphs=False)
        graphed = runner.execute(step)
        assert bucket in runner.prefill_graphs.graphs
        assert graphed.shape == eager.shape == (len(step.sample_rows), cuda_model.config.vocab_size)
        torch.testing.assert_close(graphed, eager, atol=1e-4, rtol=1e-4)
    assert runner.prefill_graphs.note is None
