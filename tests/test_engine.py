"""The batching engine end to end on a tiny random Llama (CPU): greedy equivalence with
transformers, prefix caching, preemption, seeded sampling, stops, streaming, chat, step API."""
from __future__ import annotations

import pytest
import torch

import toolkit
from toolkit import LLM, SamplingParams
from toolkit.core.engine.scheduler import RequestTooLargeError

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


VOCAB = 500  # below the fixture's vocab size


def random_prompts(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


@torch.no_grad()
def hf_greedy(reference, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' own forward, no cache, argmax each step: the independent oracle."""
    ids = torch.tensor([prompt])
    for _ in range(new_tokens):
        ids = torch.cat([ids, reference(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return toolkit.load(tiny_llama.path, device="cpu")


def engine(loaded, **options) -> LLM:
    options.setdefault("max_num_seqs", 8)
    options.setdefault("max_num_batched_tokens", 48)  # small: long prompts prefill in chunks beside decodes
    return LLM(loaded, **options)


def test_batch_of_mixed_lengths_equals_each_alone_and_transformers(loaded, tiny_llama):
    prompts = random_prompts([3, 17, 40, 64, 5, 33, 1, 100])
    batched = [out.token_ids for out in engine(loaded).generate(prompts, GREEDY)]
    alone = [engine(loaded).generate(prompt, GREEDY)[0].token_ids for prompt in prompts[:3]]
    assert batched[:3] == alone
    assert batched == [hf_greedy(tiny_llama.reference, prompt, 10) for prompt in prompts]


def test_shared_prefix_is_computed_once(loaded):
    prefix = random_prompts([48], seed=1)[0]  # three full blocks of 16
    prompts = [prefix + tail for tail in random_prompts([5, 9, 2, 20], seed=2)]
    plain = [out.token_ids for out in engine(loaded, enable_prefix_caching=False).generate(prompts, GREEDY)]
    llm = engine(loaded)
    first = llm.generate(prompts[0], GREEDY)[0]
    rest = llm.generate(prompts[1:], GREEDY)
    assert first.num_cached_tokens == 0 and [out.num_cached_tokens for out in rest] == [48, 48, 48]
    assert llm.stats()["prefix_cache_hit_tokens"] == 3 * 48
    assert [first.token_ids] + [out.token_ids for out in rest] == plain


def test_too_small_kv_pool_preempts_and_still_completes_everything(loaded):
    prompts = random_prompts([20, 31, 12, 26, 18, 9], seed=3)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    roomy = [out.token_ids for out in engine(loaded).generate(prompts, params)]
    block_bytes = 2 * 2 * 16 * 2 * 16 * 4  # layers * (k, v) * block_size * kv_heads * head_dim * fp32
    llm = engine(loaded, kv_cache_memory=10 * block_bytes)
    assert llm.stats()["num_blocks"] == 10
    tight = [out.token_ids for out in llm.generate(prompts, params)]
    assert tight == roomy
    stats = llm.stats()
    assert stats["num_preemptions"] > 0 and stats["num_free_blocks"] == stats["num_blocks"]
    assert llm.block_manager.ref_count == [0] * 10
    with pytest.raises(RequestTooLargeError, match="whole cache has 10 blocks"):
        llm.add_request(random_prompts([150])[0], SamplingParams(max_tokens=20))


def test_seeded_sampling_is_reproducible_across_batches(loaded):
    prompt = random_prompts([12], seed=4)[0]
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=42, ignore_eos=True)
    alone = engine(loaded).generate(prompt, seeded)[0].token_ids
    others = random_prompts([7, 30], seed=5)
    unseeded = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    mixed = engine(loaded).generate([others[0], prompt, others[1]], [unseeded, seeded, unseeded])
    assert mixed[1].token_ids == alone
    other_seed = engine(loaded).generate(prompt, SamplingParams(max_tokens=12, temperature=1.0, seed=7,
                                                                ignore_eos=True))[0].token_ids
    assert other_seed != alone


def test_stop_token_stop_string_max_tokens_and_logprobs(loaded):
    llm = engine(loaded)
    prompt = "The capital of France is"
    greedy = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 12
    stop_id = greedy.token_ids[4]
    first_stop = greedy.token_ids.index(stop_id)
    by_token = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop_id]))[0]
    assert by_token.token_ids == greedy.token_ids[:first_stop + 1]
    assert by_token.finish_reason == "stop" and by_token.stop_reason == stop_id
    assert by_token.text == llm.tokenizer.decode(greedy.token_ids[:first_stop], skip_special_tokens=True)
    stop_text = greedy.text[len(greedy.text) // 2:][:3]
    by_text = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0, stop=[stop_text]))[0]
    assert by_text.finish_reason == "stop" and by_text.stop_reason == stop_text
    assert by_text.text == greedy.text[:greedy.text.index(stop_text)]
    with_logprobs = llm.generate(prompt, SamplingParams(max_tokens=3, temperature=0, logprobs=2))[0]
    assert len(with_logprobs.logprobs) == 3
    ids = llm.tokenizer.encode(prompt)
    raw = loaded.logits(ids)[-1].log_softmax(-1)
    assert with_logprobs.logprobs[0][greedy.token_ids[0]] == pytest.approx(raw.max().item(), abs=1e-4)


def test_stream_increments_add_up_to_generate(loaded):
    llm = engine(loaded)
    prompts = ["Hello, my name is", "Once upon a time"]
    params = SamplingParams(max_tokens=15, temperature=0, ignore_eos=True)
    final = {out.prompt: out for out in llm.generate(prompts, params)}
    texts, tokens = {p: "" for p in prompts}, {p: [] for p in prompts}
    for out in llm.stream(prompts, params):
        texts[out.prompt] += out.new_text
        tokens[out.prompt] += out.new_token_ids
    assert texts == {p: final[p].text for p in prompts}
    assert tokens == {p: final[p].token_ids for p in prompts}


def test_chat_uses_the_tokenizer_template(loaded):
    llm = engine(loaded)
    llm.tokenizer.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                                   "{% if add_generation_prompt %}assistant:{% endif %}")
    try:
        messages = [{"role": "user", "content": "Hello"}]
        reply = llm.chat(messages, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
        rendered = llm.tokenizer.encode("<s>user: Hello\nassistant:", add_special_tokens=False)
        assert reply.prompt_token_ids == rendered
        assert reply.token_ids == llm.generate(rendered, SamplingParams(max_tokens=6, temperature=0,
                                                                       ignore_eos=True))[0].token_ids
    finally:
        llm.tokenizer.chat_template = None


def test_step_level_interface_and_abort(loaded):
    llm = engine(loaded)
    keep = llm.add_request(random_prompts([10], seed=6)[0], SamplingParams(max_tokens=5, temperature=0))
    drop = llm.add_request(random_prompts([10], seed=7)[0], SamplingParams(max_tokens=50, temperature=0))
    outputs = llm.step()
    assert {out.request_id for out in outputs} == {keep, drop}
    llm.abort(drop)
    finished = []
    while llm.has_unfinished_requests():
        finished += [out for out in llm.step() if out.finished]
    assert [out.request_id for out in finished] == [keep] and finished[0].finish_reason in ("length", "stop")
    assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]


def test_prompt_at_the_models_length_limit_is_refused(loaded):
    with pytest.raises(RequestTooLargeError, match="maximum length is 256"):
        engine(loaded).add_request(list(range(3, 259)))


def test_two_engines_on_one_model_keep_their_own_caches(loaded):
    first, second = engine(loaded), engine(loaded)
    a, b = random_prompts([30, 21], seed=8)
    expected = [engine(loaded).generate(p, GREEDY)[0].token_ids for p in (a, b)]
    first.add_request(a, GREEDY)
    second.add_request(b, GREEDY)
    done = {}
    while first.has_unfinished_requests() or second.has_unfinished_requests():
        for llm in (first, second):  # interleaved steps: each must rebind its own KV cache
            done.update((llm, out.token_ids) for out in llm.step() if out.finished)
    assert [done[first], done[second]] == expected


def test_decode_graph_inputs_equal_prepared_metadata():
    """DecodeGraphs.run writes the static inputs a captured graph reads; they must equal what the
    eager path's ``prepare`` builds for the real rows, and make the spare rows inert (runs on the
    CPU: only the replay itself needs CUDA)."""
    from types import SimpleNamespace

    from toolkit.core.engine.cuda_graphs import DecodeGraphs
    from toolkit.core.engine.model_runner import ModelRunner, RunnerConfig, StepInput

    config = RunnerConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=32)
    runner = SimpleNamespace(device=torch.device("cpu"), max_blocks_per_seq=8, states=[7], null_slot=5, config=config)
    runner.block_table_tensor = ModelRunner.block_table_tensor
    graphs = DecodeGraphs(runner, max_batch_size=8)
    replays = []
    for size in graphs.batch_sizes:
        graphs.graphs[size] = SimpleNamespace(replay=lambda size=size: replays.append(size))
        graphs.logits[size] = torch.arange(size * 3, dtype=torch.float32).view(size, 3)
    steps = [StepInput([11, 12, 13], [1, 1, 1], [5, 0, 13], [[3, 9], [4], [1, 2, 6, 7]], [0, 1, 2], state_slots=[0, 2, 1]),
             StepInput([21], [1], [2], [[6]], [0], state_slots=[3]),
             StepInput([31, 32], [1, 1], [8, 3], [[0, 1, 2], [5]], [1], state_slots=[4, 0]),
             # run ahead: the ids come on the device, token_ids are placeholders; two steps later the same
             # host buffers serve a smaller batch of the same graph size, whose spare row must not keep one
             StepInput([-1, -1, -1, -1], [1, 1, 1, 1], [6, 1, 14, 9], [[3, 9], [4], [1, 2, 6, 7], [0, 1, 2]],
                       [0, 1, 2, 3], state_slots=[0, 2, 1, 4], input_ids=torch.tensor([41, 42, 43, 44])),
             StepInput([51], [1], [3], [[6]], [0], state_slots=[3]),
             StepInput([61, 62, 63], [1, 1, 1], [7, 2, 15], [[3, 9], [4], [1, 2, 6, 7]], [0, 1, 2],
                       state_slots=[0, 2, 1])]
    for step in steps:
        logits = graphs.run(step)
        count, size = len(step.query_lens), replays[-1]
        input_ids, positions, attn = ModelRunner.prepare(SimpleNamespace(
            host_batch=lambda s: ModelRunner.host_batch(SimpleNamespace(config=config, block_table_tensor=ModelRunner.block_table_tensor), s),
            _tensor=lambda data, dtype=torch.int64: torch.as_tensor(data).to(dtype)), step)
        assert size == min(s for s in graphs.batch_sizes if s >= count)
        assert graphs.input_ids[:count].tolist() == input_ids.tolist()
        assert (graphs.input_ids[:size] >= 0).all()  # spare rows too: no placeholder left from a run-ahead step
        assert graphs.positions[:count].tolist() == positions.tolist()
        assert graphs.slot_mapping[:count].tolist() == attn.slot_mapping.tolist()
        assert graphs.seq_lens[:count].tolist() == attn.seq_lens.tolist()
        assert graphs.state_slots[:count].tolist() == step.state_slots
        for row, table in enumerate(step.block_tables):
            assert graphs.block_tables[row, :len(table)].tolist() == table
        assert (graphs.slot_mapping[count:size] == -1).all() and (graphs.seq_lens[count:size] == 0).all()
        assert (graphs.state_slots[count:size] == 5).all()
        assert torch.equal(logits, graphs.logits[size][step.sample_rows])
