"""Continuous batching without a model: chunked prefill, FCFS, preemption by recompute, abort."""
from __future__ import annotations

import random

import pytest

from toolkit.core.engine.block_manager import BlockManager
from toolkit.core.engine.sampling_params import SamplingParams
from toolkit.core.engine.scheduler import RequestTooLargeError, Scheduler
from toolkit.core.engine.sequence import Sequence, SequenceStatus
from toolkit.core.engine.state_pool import StatePool

BS = 4


def make(num_blocks=64, max_num_seqs=8, budget=32, caching=True, state_pool=None):
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, state_pool=state_pool)


def seq(request_id, prompt_len, max_tokens=4, first_token=0):
    tokens = [first_token + i for i in range(prompt_len)]
    return Sequence(request_id, tokens, SamplingParams(max_tokens=max_tokens), BS)


def next_token(s: Sequence) -> int:
    """A deterministic 'model': the token depends only on the sequence's content."""
    return (sum(s.token_ids) * 31 + len(s)) % 1000


def drive(sched: Scheduler, max_steps=10_000) -> list[list[tuple[str, int, int]]]:
    """Run to completion; returns each step's (request, start, num_new_tokens)."""
    steps = []
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return steps
        out = sched.schedule()
        assert not out.is_empty, "the scheduler made no progress"
        assert out.num_batched_tokens <= sched.max_num_batched_tokens and len(sched.running) <= sched.max_num_seqs
        for item in out.scheduled:
            assert item.start == item.seq.num_computed_tokens
            assert len(item.seq.block_table) * BS >= item.start + item.num_new_tokens
        steps.append([(i.seq.request_id, i.start, i.num_new_tokens) for i in out.scheduled])
        sched.update(out, [next_token(i.seq) if i.samples else None for i in out.scheduled])
        for item in out.scheduled:
            if item.samples and item.seq.num_output_tokens >= item.seq.params.max_tokens:
                sched.finish(item.seq, "length")
    raise AssertionError("did not finish")


def test_long_prompt_is_prefilled_in_chunks_and_samples_once_at_the_end():
    sched = make(budget=8)
    s = seq("a", 20, max_tokens=2)
    sched.add(s)
    first = sched.schedule()
    assert [(i.start, i.num_new_tokens, i.samples) for i in first.scheduled] == [(0, 8, False)]
    sched.update(first, [None])
    steps = drive(sched)
    assert steps == [[("a", 8, 8)], [("a", 16, 4)], [("a", 20, 1)]]
    assert s.num_output_tokens == 2 and s.status == SequenceStatus.FINISHED


def test_running_decodes_go_first_and_new_prompts_fill_the_rest_of_the_budget():
    sched = make(budget=10)
    sched.add(seq("old", 4, max_tokens=5))
    out = sched.schedule()
    sched.update(out, [7])
    sched.add(seq("new", 30, max_tokens=1))
    out = sched.schedule()
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.scheduled] == [("old", 1), ("new", 9)]


def test_fcfs_a_waiting_request_that_does_not_fit_blocks_those_behind_it():
    sched = make(num_blocks=10, budget=64)
    sched.add(seq("big-running", 20, max_tokens=8))   # 5 blocks now, up to 7
    sched.update(sched.schedule(), [1])
    sched.add(seq("big-waiting", 24, max_tokens=1, first_token=500))  # needs 6 blocks, 4 free
    sched.add(seq("small", 2, max_tokens=1, first_token=900))
    out = sched.schedule()
    assert [i.seq.request_id for i in out.scheduled] == ["big-running"]


def test_preemption_recomputes_the_youngest_and_everything_finishes_without_leaks():
    sched = make(num_blocks=12, max_num_seqs=8, budget=64)
    seqs = [seq(f"r{i}", 10 + i, max_tokens=20, first_token=100 * i) for i in range(6)]
    for s in seqs:
        sched.add(s)
    drive(sched)
    assert sched.num_preemptions > 0
    assert all(s.status == SequenceStatus.FINISHED and s.num_output_tokens == 20 for s in seqs)
    assert sched.block_manager.num_free_blocks == 12 and set(sched.block_manager.ref_count) == {0}
    # recompute must not change what was generated: same tokens as a run with plenty of room
    roomy = make(num_blocks=200, budget=64)
    clones = [seq(f"r{i}", 10 + i, max_tokens=20, first_token=100 * i) for i in range(6)]
    for s in clones:
        roomy.add(s)
    drive(roomy)
    assert roomy.num_preemptions == 0
    assert [s.token_ids for s in seqs] == [s.token_ids for s in clones]


def test_oldest_running_sequence_is_never_preempted_for_a_younger_one():
    sched = make(num_blocks=6, budget=64)
    old, young = seq("old", 8, max_tokens=12), seq("young", 8, max_tokens=12)
    sched.add(old)
    sched.add(young)
    preempted = []
    while sched.has_unfinished():
        out = sched.schedule()
        preempted += [s.request_id for s in out.preempted]
        sched.update(out, [next_token(i.seq) if i.samples else None for i in out.scheduled])
        for item in out.scheduled:
            if item.samples and item.seq.num_output_tokens >= 12:
                sched.finish(item.seq, "length")
    assert preempted and set(preempted) == {"young"}


@pytest.mark.parametrize("seed", range(5))
def test_random_workloads_always_complete(seed):
    rng = random.Random(seed)
    sched = make(num_blocks=rng.randint(8, 20), max_num_seqs=rng.randint(1, 6), budget=rng.randint(4, 40),
                 caching=bool(seed % 2))
    shared = list(range(1000, 1012))
    seqs = []
    for i in range(12):
        prompt = (shared if rng.random() < 0.5 else []) + [rng.randrange(500) for _ in range(rng.randint(1, 12))]
        s = Sequence(f"r{i}", prompt, SamplingParams(max_tokens=rng.randint(1, 8)), BS)
        try:
            sched.add(s)
            seqs.append(s)
        except RequestTooLargeError:
            assert s.blocks_needed(len(prompt) + s.params.max_tokens) > sched.block_manager.num_blocks
    drive(sched)
    assert all(s.num_output_tokens == s.params.max_tokens for s in seqs)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_request_that_can_never_fit_fails_clearly():
    sched = make(num_blocks=4)
    with pytest.raises(RequestTooLargeError, match="needs 20 tokens of KV cache .* 4 blocks"):
        sched.add(seq("huge", 12, max_tokens=8))


def test_abort_frees_blocks_of_running_and_waiting_requests():
    sched = make(num_blocks=8, max_num_seqs=1)
    a, b = seq("a", 10), seq("b", 6)
    sched.add(a)
    sched.add(b)
    sched.update(sched.schedule(), [3])
    assert a.status == SequenceStatus.RUNNING and b.status == SequenceStatus.WAITING
    sched.finish(a, "abort")
    sched.finish(b, "abort")
    assert not sched.has_unfinished() and sched.block_manager.num_free_blocks == 8
    assert a.finish_reason == b.finish_reason == "abort"


def test_state_pool_limits_admission_and_slots_are_returned():
    pool = StatePool(2, {})
    sched = make(state_pool=pool)
    for i in range(3):
        sched.add(seq(f"r{i}", 4, max_tokens=3))
    out = sched.schedule()
    assert [i.seq.request_id for i in out.scheduled] == ["r0", "r1"] and pool.num_free_slots == 0
    sched.update(out, [1, 1])
    drive(sched)
    assert pool.num_free_slots == 2
