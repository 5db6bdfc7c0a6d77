"""The server's engine thread without HTTP: an aborted request leaves the engine before its next
step, freeing its KV blocks and its recurrent-state slot; a rejected one never enters it."""
from __future__ import annotations

import asyncio

import pytest
import torch

import toolkit
from toolkit import LLM, SamplingParams
from toolkit.core.engine.state_pool import StatePool
from toolkit.core.serve.engine_loop import EngineLoop, Submission
from toolkit.core.serve.errors import ApiError


class TokenCounter:
    """A minimal observer: counts generated tokens and finish reasons."""

    def __init__(self):
        self.tokens, self.finished = 0, []

    def on_prompt(self, num_tokens):
        pass

    def on_first_token(self, seconds):
        self.tokens += 1

    def on_token(self, seconds):
        self.tokens += 1

    def on_finish(self, finish_reason, seconds):
        self.finished.append(finish_reason)


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return toolkit.load(tiny_llama.path, device="cpu")


def run_with_loop(engine_loop: EngineLoop, scenario):
    async def main():
        engine_loop.start(asyncio.get_running_loop())
        try:
            return await scenario()
        finally:
            engine_loop.stop()

    return asyncio.run(main())


async def until(condition, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError


@pytest.mark.parametrize("run_ahead", [False, True], ids=["sync", "ahead"])
def test_abort_frees_kv_blocks_and_state_slot_at_once(loaded, run_ahead):
    llm = LLM(loaded, max_num_seqs=4, run_ahead=run_ahead)  # running ahead (a CUDA engine's default) too
    # an engine with a state pool (as hybrid models have): the scheduler takes a slot per running request
    llm.scheduler.state_pool = StatePool(4, {"state": ((8,), torch.float32)})
    counter = TokenCounter()
    engine_loop = EngineLoop(llm, observer=counter)
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)

    async def scenario():
        group = engine_loop.submit([Submission(0, lambda: list(range(3, 40)), params, 200)], stream=True)
        await group.start()
        await group.deltas().__anext__()
        during = dict(engine_loop.stats)
        group.abort()
        await until(lambda: engine_loop.stats["num_tracked"] == 0)
        return during, dict(engine_loop.stats)

    during, after = run_with_loop(engine_loop, scenario)
    assert during["kv_blocks_used"] >= 3 and during["state_slots_used"] == 1
    assert (after["kv_blocks_used"], after["state_slots_used"], after["num_running"]) == (0, 0, 0)
    assert counter.finished == ["abort"] and counter.tokens < 200


def test_a_prompt_too_long_for_the_context_is_rejected_before_the_engine(loaded):
    llm = LLM(loaded, max_num_seqs=4)
    engine_loop = EngineLoop(llm)

    async def scenario():
        group = engine_loop.submit([Submission(0, lambda: list(range(3, 253)), SamplingParams(), 10)], stream=False)
        with pytest.raises(ApiError, match="maximum context length is 256 tokens.*260 tokens") as excinfo:
            await group.start()
        return excinfo.value

    error = run_with_loop(engine_loop, scenario)
    assert error.status == 400 and error.code == "context_length_exceeded"
    assert not llm.has_unfinished_requests() and engine_loop.stats["kv_blocks_used"] == 0


def test_a_failing_step_fails_the_requests_in_flight_and_the_loop_goes_on(loaded, monkeypatch):
    llm = LLM(loaded, max_num_seqs=4)
    engine_loop = EngineLoop(llm)
    real_step, calls = llm.step, []

    def step_failing_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return real_step()

    monkeypatch.setattr(llm, "step", step_failing_once)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)

    async def collect(group):
        await group.start()
        return [delta async for delta in group.deltas()]

    async def scenario():
        failed = engine_loop.submit([Submission(0, lambda: list(range(3, 20)), params, 4)], stream=True)
        with pytest.raises(ApiError, match="device lost") as excinfo:
            await collect(failed)
        after = engine_loop.submit([Submission(0, lambda: list(range(3, 20)), params, 4)], stream=False)
        return excinfo.value, await collect(after)

    error, deltas = run_with_loop(engine_loop, scenario)
    assert error.status == 500
    assert [d.finished for d in deltas] == [True] and deltas[0].num_output_tokens == 4
    assert engine_loop.stats["kv_blocks_used"] == 0


def test_concurrent_streams_with_run_ahead_give_the_synchronous_tokens(loaded):
    """The server's engine thread drives an engine that runs ahead (engine/run_ahead.py, the default on
    CUDA): requests joining and leaving at different steps get the tokens the synchronous engine gives."""
    prompts = [list(range(3, 3 + n)) for n in (9, 30, 4)]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (12, 5, 20)]
    expected = [o.token_ids for o in LLM(loaded, max_num_seqs=4, run_ahead=False).generate(prompts, params)]
    llm = LLM(loaded, max_num_seqs=4, run_ahead=True)
    ahead, schedule_ahead = [], llm.scheduler.schedule_ahead
    llm.scheduler.schedule_ahead = lambda items: ahead.append(len(items)) or schedule_ahead(items)
    engine_loop = EngineLoop(llm)

    async def collect(prompt, param, delay):
        await asyncio.sleep(delay)  # the later requests join while others decode
        group = engine_loop.submit([Submission(0, lambda: prompt, param, param.max_tokens)], stream=True)
        await group.start()
        return [t for delta in [d async for d in group.deltas()] for t in delta.token_ids]

    async def scenario():
        return await asyncio.gather(*(collect(p, q, 0.05 * i) for i, (p, q) in enumerate(zip(prompts, params))))

    assert run_with_loop(engine_loop, scenario) == expected
    assert ahead and engine_loop.stats["kv_blocks_used"] == 0
