"""Run-ahead decoding (engine/run_ahead.py) on a tiny random Llama and a hybrid model (CPU).

The synchronous engine is the oracle: test_engine.py checks it against transformers' greedy
decoding, and here every run-ahead result must equal it token for token, with the run-ahead path
counted so a test cannot pass by never taking it. On the CPU the "device" tokens are read at once,
but the scheduling (placeholders, blocks, rows of sequences that stopped) is the one the GPU runs.
"""
from __future__ import annotations

import pytest
import torch

import toolkit
from toolkit import LLM, SamplingParams
from toolkit.core.engine.scheduler import PLACEHOLDER_TOKEN

VOCAB = 500


def random_prompts(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return toolkit.load(tiny_llama.path, device="cpu")


def engine(loaded, run_ahead: bool, **options) -> LLM:
    """An engine whose run-ahead launches are counted in ``llm.ahead_steps``."""
    options.setdefault("max_num_seqs", 8)
    options.setdefault("max_num_batched_tokens", 48)
    llm = LLM(loaded, run_ahead=run_ahead, **options)
    llm.ahead_steps = 0
    schedule_ahead = llm.scheduler.schedule_ahead

    def counted(out):
        llm.ahead_steps += 1
        return schedule_ahead(out)

    llm.scheduler.schedule_ahead = counted
    return llm


def results(outputs):
    return [(o.token_ids, o.finish_reason, o.stop_reason, o.text) for o in outputs]


def assert_no_leftovers(llm: LLM) -> None:
    """Every block and sequence given back, no placeholder left in any finished sequence."""
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]
    assert all(count == 0 for count in llm.block_manager.ref_count)
    assert not llm.scheduler.running and not llm.scheduler.waiting


def test_mixed_lengths_stops_and_seeds_equal_the_synchronous_engine(loaded):
    prompts = random_prompts([3, 17, 40, 64, 5, 33, 1, 100], seed=1)
    sync_greedy = engine(loaded, False).generate(prompts, SamplingParams(max_tokens=14, temperature=0, ignore_eos=True))
    # stop ids taken from the greedy outputs, so some sequences stop early while others run on
    stop_ids = [out.token_ids[4] for out in sync_greedy[:3]]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (1, 2, 9, 14)]
    params += [SamplingParams(max_tokens=14, temperature=0, stop_token_ids=stop_ids),
               SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=3, ignore_eos=True),
               SamplingParams(max_tokens=14, temperature=0, stop=[sync_greedy[6].text[6:9]] if sync_greedy[6].text[6:9]
                              else None, ignore_eos=True),
               SamplingParams(max_tokens=11, temperature=0, ignore_eos=True)]
    expected = results(engine(loaded, False).generate(prompts, params))
    llm = engine(loaded, True)
    assert results(llm.generate(prompts, params)) == expected
    assert llm.ahead_steps > 8
    assert_no_leftovers(llm)
    assert any(finish == "stop" for _, finish, _, _ in expected)  # the stop paths were exercised


def test_one_sequence_stopping_drops_its_row_computed_ahead(loaded):
    prompts = random_prompts([20, 9, 31], seed=2)
    greedy = engine(loaded, False).generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    stop_id = greedy[1].token_ids[3]
    params = SamplingParams(max_tokens=16, temperature=0, stop_token_ids=[stop_id])
    expected = results(engine(loaded, False).generate(prompts, params))
    llm = engine(loaded, True)
    got = results(llm.generate(prompts, params))
    assert got == expected
    assert len(got[1][0]) == greedy[1].token_ids.index(stop_id) + 1 < 16 and got[1][1] == "stop"
    assert llm.ahead_steps > 0
    assert_no_leftovers(llm)


def test_requests_added_and_aborted_between_steps(loaded):
    first, late, dropped = random_prompts([12, 25, 8], seed=3)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = {name: engine(loaded, False).generate(p, params)[0].token_ids
             for name, p in (("first", first), ("late", late))}
    llm = engine(loaded, True)
    ids = {"first": llm.add_request(first, params), "dropped": llm.add_request(dropped, SamplingParams(max_tokens=40))}
    tokens = {name: [] for name in ("first", "late", "dropped")}
    names = {request_id: name for name, request_id in ids.items()}
    for step in range(30):
        if step == 3:  # a run-ahead step is in flight now: the new request must wait for the next schedule
            assert llm._ahead is not None
            ids["late"] = llm.add_request(late, params)
            names[ids["late"]] = "late"
        if step == 5:
            llm.abort(ids["dropped"])
        for out in llm.step():
            tokens[names[out.request_id]] = out.token_ids
        if not llm.has_unfinished_requests():
            break
    assert tokens["first"] == alone["first"] and tokens["late"] == alone["late"]
    assert 0 < len(tokens["dropped"]) <= 6
    assert llm.ahead_steps > 0
    llm.step()  # whatever ran ahead for finished sequences is dropped
    assert_no_leftovers(llm)


def test_no_placeholder_is_ever_seen_outside_a_step(loaded):
    llm = engine(loaded, True)
    prompts = random_prompts([7, 16, 15], seed=4)  # 16 and 15: the next positions cross a block boundary
    for prompt in prompts:
        llm.add_request(prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    while llm.has_unfinished_requests():
        for out in llm.step():
            assert PLACEHOLDER_TOKEN not in out.token_ids
        for seq in llm.scheduler.running:
            assert PLACEHOLDER_TOKEN not in seq.token_ids
    assert llm.ahead_steps > 0
    assert_no_leftovers(llm)


def test_tight_kv_pool_preempts_instead_of_running_ahead(loaded):
    prompts = random_prompts([20, 31, 12, 26, 18, 9], seed=5)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    roomy = [out.token_ids for out in engine(loaded, False).generate(prompts, params)]
    block_bytes = 2 * 2 * 16 * 2 * 16 * 4  # layers * (k, v) * block_size * kv_heads * head_dim * fp32
    llm = engine(loaded, True, kv_cache_memory=10 * block_bytes)
    assert [out.token_ids for out in llm.generate(prompts, params)] == roomy
    assert llm.stats()["num_preemptions"] > 0 and llm.ahead_steps > 0
    assert_no_leftovers(llm)


def test_penalties_and_logprobs_run_synchronously_with_the_same_tokens(loaded):
    prompts = random_prompts([10, 22], seed=6)
    params = [SamplingParams(max_tokens=8, temperature=0, repetition_penalty=1.3, ignore_eos=True),
              SamplingParams(max_tokens=8, temperature=0, logprobs=2, ignore_eos=True)]
    expected = engine(loaded, False).generate(prompts, params)
    llm = engine(loaded, True)
    got = llm.generate(prompts, params)
    assert results(got) == results(expected)
    assert [o.logprobs for o in got] == [o.logprobs for o in expected]
    assert llm.ahead_steps == 0


def test_hybrid_model_state_slots_with_run_ahead(tmp_path):
    from hybrid_fixtures import prompt, save_hybrid  # noqa: PLC0415

    save_hybrid(tmp_path, "qwen3_next", seed=5)
    model = toolkit.load(tmp_path, device="cpu")
    prompts = [prompt(n, seed=20 + i).tolist() for i, n in enumerate([5, 40, 23, 1])]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (12, 3, 9, 12)]
    expected = [o.token_ids for o in LLM(model, max_num_seqs=4, max_num_batched_tokens=32, run_ahead=False)
                .generate(prompts, params)]
    llm = engine(model, True, max_num_seqs=4, max_num_batched_tokens=32)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert llm.ahead_steps > 0
    assert llm.state_pool.num_free_slots == 4


def test_host_sampled_steps_never_run_ahead():
    from types import SimpleNamespace  # noqa: PLC0415

    from toolkit.core.engine.run_ahead import PendingStep, ahead_items  # noqa: PLC0415
    from toolkit.core.engine.scheduler import SchedulerOutput  # noqa: PLC0415

    # host-side sampling (no device ids) never runs ahead, whatever the batch
    scheduler = SimpleNamespace(waiting=[], running=[])
    assert ahead_items(PendingStep(SchedulerOutput(), [], token_ids=[]), scheduler, 100) == []
