"""Continuous batching: which sequences run this step and how many tokens each computes.

Every step has a token budget (``max_num_batched_tokens``) and a sequence cap
(``max_num_seqs``). Running sequences go first, oldest first: a decoding one takes one
token, one still prefilling takes the next chunk of its prompt that fits the budget
(chunked prefill). Waiting requests then join in arrival order (FCFS; a request that does
not fit blocks the ones behind it). When the KV cache runs out, the most recently admitted
running sequence is preempted: its blocks are freed and it is recomputed later from its
prompt and the tokens it already produced. The oldest running sequence is never preempted
for a younger one, and every admitted request fits the whole cache on its own, so the
engine always makes progress.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..errors import ToolkitError
from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


PLACEHOLDER_TOKEN = -1  # a sampled token not yet read back from the device (run-ahead)


class RequestTooLargeError(ToolkitError, ValueError):
    """A request that could never run: it needs more KV blocks (or positions) than exist."""


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int
    start: int              # position of the first new token (tokens before it are in the cache)
    samples: bool           # this chunk reaches the end of the known tokens, so a token is sampled
    ran_ahead: bool = False  # schedule_ahead advanced it before its token was read (a placeholder holds the place)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int | None = None, state_pool=None):
        self.block_manager, self.state_pool, self.max_model_len = block_manager, state_pool, max_model_len
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # ---- requests ---------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request; refuse at once one whose prompt plus max_tokens could never fit the cache."""
        total = seq.num_prompt_tokens + seq.params.max_tokens
        if self.max_model_len is not None:
            total = min(total, self.max_model_len)
        if seq.blocks_needed(total) > self.block_manager.num_blocks:
            raise RequestTooLargeError(
                f"request {seq.request_id!r} needs {total} tokens of KV cache ({seq.blocks_needed(total)} blocks of "
                f"{seq.block_size}) but the whole cache has {self.block_manager.num_blocks} blocks; lower max_tokens, "
                "shorten the prompt or give the engine more kv_cache_memory")
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished and release its KV blocks (and state slot)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason

    def find(self, request_id: str) -> Sequence | None:
        return next((s for s in (*self.running, *self.waiting) if s.request_id == request_id), None)

    # ---- one step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted:  # no room was short this step, so new requests may join
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        queue = list(self.running)
        while queue and budget > 0:
            seq = queue.pop(0)
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.allocate_slots(seq, num_new):
                victim = queue.pop() if queue else seq  # youngest first; itself only when nothing is left
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.scheduled.append(self._chunk(seq, num_new))
                budget -= num_new
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            # cached prefix tokens are never run through the model, so they would have no prompt logprobs
            hits = [] if seq.wants_prompt_logprobs else self.block_manager.lookup_prefix(seq)
            num_new = min(len(seq) - len(hits) * seq.block_size, budget)
            if not self.block_manager.can_allocate(seq, num_new, hits):
                break
            if self.state_pool is not None and self.state_pool.num_free_slots == 0:
                break
            self.waiting.popleft()
            self.block_manager.take_prefix(seq, hits)
            self.block_manager.allocate_slots(seq, num_new)
            if self.state_pool is not None:
                self.state_pool.allocate(seq.request_id)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(self._chunk(seq, num_new))
            budget -= num_new

    @staticmethod
    def _chunk(seq: Sequence, num_new: int) -> ScheduledSequence:
        start = seq.num_computed_tokens
        return ScheduledSequence(seq, num_new, start, samples=start + num_new == len(seq))

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def _release(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        if self.state_pool is not None:
            self.state_pool.free(seq.request_id)

    # ---- after the model ran ----------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: list[int | None]) -> None:
        """Advance each scheduled sequence past its chunk and append its sampled token, if any (for
        a chunk ``schedule_ahead`` advanced already: write the token over its placeholder). A
        sequence that finished meanwhile (stopped by the step before, or aborted) is left alone."""
        for item, token_id in zip(out.scheduled, sampled):
            seq = item.seq
            if seq.is_finished:
                continue
            if item.ran_ahead:
                position = item.start + item.num_new_tokens
                assert seq.token_ids[position] == PLACEHOLDER_TOKEN, "each sampled token is written once"
                seq.token_ids[position] = token_id
                continue
            self._advance(item)
            if item.samples:
                seq.append_token(token_id)

    def _advance(self, item: ScheduledSequence) -> None:
        item.seq.num_computed_tokens += item.num_new_tokens
        self.block_manager.commit_computed(item.seq)

    # ---- running ahead (engine/run_ahead.py) --------------------------------------------------
    def schedule_ahead(self, items: list[ScheduledSequence]) -> SchedulerOutput:
        """The next step for the sequences of ``items`` (chunks of a launched step that sample),
        scheduled before their tokens are known: each is advanced past its chunk now, with
        ``PLACEHOLDER_TOKEN`` for the token it is sampling (``update`` writes it later), and
        decodes that token next. Only for what ``run_ahead.ahead_items`` chose: these are all the
        running sequences that go on, nothing waits, and the blocks fit, so this is the step
        ``schedule`` would return once the tokens were in."""
        ahead = SchedulerOutput()
        for item in items:
            seq = item.seq
            self._advance(item)  # the full blocks before the placeholder hold real tokens only
            seq.append_token(PLACEHOLDER_TOKEN)
            item.ran_ahead = True
            if not self.block_manager.allocate_slots(seq, 1):
                raise RuntimeError(f"run-ahead found no KV block for {seq.request_id!r}; ahead_items should have refused")
            ahead.scheduled.append(self._chunk(seq, 1))
        return ahead
