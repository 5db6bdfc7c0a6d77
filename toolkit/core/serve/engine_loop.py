"""One thread that owns the engine: it adds and aborts requests, calls ``LLM.step`` and hands
each step's increments to the asyncio event loop that serves HTTP.

Only this thread touches the ``LLM`` (scheduler, KV blocks, tokenizer): the event loop sends it
commands through a queue and receives events back with ``call_soon_threadsafe``, one call per
step. An aborted request is dropped before the next step, so its KV blocks (and state slot)
are free at once. Nothing here knows HTTP; ``RequestGroup`` is what a route awaits.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from ..engine.sampling_params import SamplingParams
from ..engine.scheduler import RequestTooLargeError
from .errors import ApiError

log = logging.getLogger("toolkit.serve")


@dataclass
class Submission:
    """One engine request of an HTTP request.

    :param index: its choice index in the response
    :param encode: returns the prompt's token ids; called on the engine thread, which alone uses the
        tokenizer (so it may render a chat template or tokenize; an ApiError it raises rejects the request)
    :param params: sampling parameters; ``max_tokens`` is replaced by the resolved ``max_tokens`` below
    :param max_tokens: most new tokens (None: the rest of the context); the prompt plus this must
        fit the context, as OpenAI requires; 0 still samples one token (for scoring requests)
    :param echo: also return the prompt's text (decoded from its ids)
    """

    index: int
    encode: Callable[[], list[int]]
    params: SamplingParams
    max_tokens: int | None
    echo: bool = False
    prompt_param: str = "prompt"  # the request field named in a context-length error


@dataclass
class TokenLogprob:
    """A token with its log-probability and the most likely alternatives (text, logprob), best first."""

    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass
class Delta:
    """What one request produced since its previous delta (everything, for a non-streaming request)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None
    num_output_tokens: int
    prompt_logprobs: list[TokenLogprob | None] | None = None  # on the first delta, when asked for


@dataclass
class Accepted:
    """The engine took a request: its prompt's token ids, and (for echo) the prompt's text and tokens' texts."""

    index: int
    prompt_token_ids: list[int]
    prompt_text: str | None = None
    prompt_tokens: list[str] | None = None


@dataclass
class _Rejected:
    index: int
    error: ApiError


class RequestGroup:
    """The engine requests of one HTTP request (``n`` choices of each prompt), as the route sees them."""

    def __init__(self, loop: "EngineLoop", submissions: list[Submission], stream: bool):
        self.engine_loop, self.submissions, self.stream = loop, submissions, stream
        self.queue: asyncio.Queue = asyncio.Queue()
        self.request_ids = {s.index: f"{loop.id_prefix}-{next(loop.ids)}" for s in submissions}
        self.arrival = time.perf_counter()
        self.unfinished = {s.index for s in submissions}

    async def start(self) -> dict[int, Accepted]:
        """Wait until the engine took every request; returns what it accepted, per index.

        Raises the first ApiError (a prompt too long, say) after aborting the others."""
        accepted, errors = {}, []
        for _ in self.submissions:  # the engine thread answers each submission once, before any delta
            event = await self.queue.get()
            if isinstance(event, _Rejected):
                errors.append(event.error)
                self.unfinished.discard(event.index)
            else:
                accepted[event.index] = event
        if errors:
            self.abort()
            raise errors[0]
        return accepted

    async def deltas(self) -> AsyncIterator[Delta]:
        """Each request's increments as the engine produces them, until all are finished."""
        while self.unfinished:
            event = await self.queue.get()
            if isinstance(event, _Rejected):  # the engine failed mid-request
                self.abort()
                raise event.error
            if isinstance(event, Delta):
                if event.finished:
                    self.unfinished.discard(event.index)
                yield event

    def abort(self) -> None:
        """Stop every unfinished request of the group and free its cache (no-op once all are done)."""
        if self.unfinished:
            self.engine_loop.abort([self.request_ids[i] for i in self.unfinished])
            self.unfinished.clear()


class _Tracked:
    """The engine thread's bookkeeping for one request: what was already sent, and token timing."""

    def __init__(self, group: RequestGroup, submission: Submission):
        self.group, self.index, self.params = group, submission.index, submission.params
        self.sent_text = self.sent_logprobs = 0
        self.sent_prompt_logprobs = False
        self.last_token_time: float | None = None
        # text that might be the start of a stop string is held back until it cannot be
        self.holdback = max((len(s) for s in self.params.stop), default=1) - 1


class EngineLoop:
    """Drives ``llm.step`` on its own thread.

    :param llm: the engine (used from the loop thread only, once ``start`` ran)
    :param observer: receives token timings and counts (``ServerMetrics``), or None
    """

    def __init__(self, llm, observer=None):
        self.llm, self.observer = llm, observer
        self.ids, self.id_prefix = itertools.count(), "srv"
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._tracked: dict[str, _Tracked] = {}
        self._queued_lock = threading.Lock()
        self._num_queued = 0
        self._thread: threading.Thread | None = None
        self._asyncio_loop: asyncio.AbstractEventLoop | None = None
        self.stats: dict[str, float] = {}
        self._publish_stats()

    # ---- event-loop side ------------------------------------------------------------------------
    def start(self, asyncio_loop: asyncio.AbstractEventLoop) -> None:
        self._asyncio_loop = asyncio_loop
        self._thread = threading.Thread(target=self._run, name="toolkit-engine", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        if self._thread is not None:
            self._commands.put(None)
            self._thread.join()
            self._thread = None

    @property
    def num_waiting(self) -> int:
        """Requests submitted but not running yet (queued for the engine thread, or waiting in the scheduler)."""
        return self._num_queued + int(self.stats.get("num_waiting", 0))

    def submit(self, submissions: list[Submission], stream: bool) -> RequestGroup:
        group = RequestGroup(self, submissions, stream)
        with self._queued_lock:
            self._num_queued += len(submissions)
        self._commands.put(("add", group))
        return group

    def abort(self, request_ids: list[str]) -> None:
        self._commands.put(("abort", request_ids))

    # ---- engine thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            block = not self.llm.has_unfinished_requests()
            if not self._drain_commands(block):
                return
            if self.llm.has_unfinished_requests():
                self._step()
            else:
                self._publish_stats()

    def _drain_commands(self, block: bool) -> bool:
        """Apply queued adds and aborts (waiting for one if ``block``); False when told to stop."""
        while True:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
            if command is None:
                return False
            kind, payload = command
            self._add(payload) if kind == "add" else self._abort(payload)
            block = False

    def _add(self, group: RequestGroup) -> None:
        events = []
        for submission in group.submissions:
            events.append(self._add_one(group, submission))
        self._publish_stats()  # before the queued count drops, so num_waiting never misses them
        with self._queued_lock:
            self._num_queued -= len(group.submissions)
        self._deliver([(group, event) for event in events])

    def _add_one(self, group: RequestGroup, submission: Submission):
        request_id = group.request_ids[submission.index]
        try:
            prompt_ids = submission.encode()
            params = self._fit_context(submission, len(prompt_ids))
            self.llm.add_request(prompt_ids, params, request_id, stream=group.stream)
        except ApiError as exc:
            return _Rejected(submission.index, exc)
        except (RequestTooLargeError, ValueError) as exc:
            return _Rejected(submission.index, ApiError(400, str(exc), param=submission.prompt_param))
        except Exception as exc:  # noqa: BLE001 - a tokenizer or engine bug fails this request, not the thread
            log.exception("adding a request failed")
            return _Rejected(submission.index, ApiError(500, f"adding the request failed: {type(exc).__name__}: {exc}"))
        submission.params = params
        self._tracked[request_id] = _Tracked(group, submission)
        if self.observer is not None:
            self.observer.on_prompt(len(prompt_ids))
        if not submission.echo or self.llm.tokenizer is None:
            return Accepted(submission.index, prompt_ids)
        return Accepted(submission.index, prompt_ids, self.llm.tokenizer.decode(prompt_ids),
                        [self._token_text(token_id) for token_id in prompt_ids])

    def _fit_context(self, submission: Submission, num_prompt_tokens: int) -> SamplingParams:
        """The params with ``max_tokens`` resolved; an OpenAI-worded 400 when the context is too short."""
        limit = self.llm.max_model_len
        max_tokens = limit - num_prompt_tokens if submission.max_tokens is None else submission.max_tokens
        if num_prompt_tokens >= limit or num_prompt_tokens + max_tokens > limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                           f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} "
                           "in the completion). Please reduce the length of the prompt or completion.",
                           param=submission.prompt_param, code="context_length_exceeded")
        return dataclasses.replace(submission.params, max_tokens=max(max_tokens, 1))

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self._tracked.pop(request_id, None) is not None:
                self.llm.abort(request_id)
                if self.observer is not None:
                    self.observer.on_finish("abort", None)

    def _step(self) -> None:
        try:
            events = self._events(self.llm.step())
        except Exception as exc:  # noqa: BLE001 - fail the requests in flight, keep serving the next ones
            log.exception("engine step failed")
            events = self._fail_all(ApiError(500, f"the engine failed: {type(exc).__name__}: {exc}"))
        self._publish_stats()  # first, so whoever reads a delta sees stats at least as new
        self._deliver(events)

    def _events(self, outputs) -> list[tuple[RequestGroup, Delta]]:
        """The deltas to send for one step's outputs (every step for streams, the last for the rest)."""
        now = time.perf_counter()
        events = []
        for out in outputs:
            tracked = self._tracked.get(out.request_id)
            if tracked is None:
                continue
            self._observe_token(tracked, now, out.finish_reason if out.finished else None)
            if tracked.group.stream or out.finished:
                events.append((tracked.group, self._delta(tracked, out)))
            if out.finished:
                del self._tracked[out.request_id]
        return events

    def _observe_token(self, tracked: _Tracked, now: float, finish_reason: str | None) -> None:
        if self.observer is not None:
            if tracked.last_token_time is None:
                self.observer.on_first_token(now - tracked.group.arrival)
            else:
                self.observer.on_token(now - tracked.last_token_time)
            if finish_reason is not None:
                self.observer.on_finish(finish_reason, now - tracked.group.arrival)
        tracked.last_token_time = now

    def _fail_all(self, error: ApiError) -> list[tuple[RequestGroup, _Rejected]]:
        """Abort every request in flight; the errors to send their groups."""
        events = []
        for request_id, tracked in list(self._tracked.items()):
            self.llm.abort(request_id)
            events.append((tracked.group, _Rejected(tracked.index, error)))
        self._tracked.clear()
        return events

    def _delta(self, tracked: _Tracked, out) -> Delta:
        text = out.text
        end = len(text) if out.finished else max(tracked.sent_text, len(text) - tracked.holdback)
        new_text, tracked.sent_text = text[tracked.sent_text:end], end
        logprobs = None
        if out.logprobs is not None:
            entries = out.logprobs[tracked.sent_logprobs:]
            ids = out.token_ids[tracked.sent_logprobs:]
            tracked.sent_logprobs += len(entries)
            logprobs = [self._token_logprob(token_id, entry, tracked.params.logprobs)
                        for token_id, entry in zip(ids, entries)]
        prompt_logprobs = None
        if out.prompt_logprobs is not None and not tracked.sent_prompt_logprobs:
            tracked.sent_prompt_logprobs = True
            prompt_logprobs = [None] + [
                self._token_logprob(token_id, entry, tracked.params.prompt_logprobs)
                for token_id, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:])]
        new_ids = out.token_ids if not tracked.group.stream else out.new_token_ids
        return Delta(tracked.index, new_text, list(new_ids), logprobs, out.finished, out.finish_reason,
                     len(out.token_ids), prompt_logprobs)

    def _token_logprob(self, token_id: int, entry: dict[int, float], top_n: int | None) -> TokenLogprob:
        ranked = sorted(entry.items(), key=lambda item: -item[1])[:top_n or 0]
        return TokenLogprob(token_id, self._token_text(token_id), entry[token_id],
                            [(i, self._token_text(i), value) for i, value in ranked])

    def _token_text(self, token_id: int) -> str:
        tokenizer = self.llm.tokenizer
        return tokenizer.decode([token_id]) if tokenizer is not None else f"<{token_id}>"

    def _deliver(self, events: list[tuple[RequestGroup, object]]) -> None:
        if events and self._asyncio_loop is not None:
            self._asyncio_loop.call_soon_threadsafe(_put_all, events)

    def _publish_stats(self) -> None:
        """A snapshot the event loop reads (/metrics, the 503 check) without touching the engine."""
        scheduler, blocks = self.llm.scheduler, self.llm.block_manager
        stats = {"num_running": len(scheduler.running), "num_waiting": len(scheduler.waiting),
                 "kv_blocks_used": blocks.num_used_blocks, "kv_blocks_total": blocks.num_blocks,
                 "num_preemptions": scheduler.num_preemptions, "num_tracked": len(self._tracked),
                 "prefix_cache_hit_rate": blocks.stats.hit_rate}
        pool = getattr(scheduler, "state_pool", None)
        if pool is not None:
            stats["state_slots_used"] = pool.num_slots - pool.num_free_slots
            stats["state_slots_total"] = pool.num_slots
        self.stats = stats


def _put_all(events: list[tuple[RequestGroup, object]]) -> None:
    for group, event in events:
        group.queue.put_nowait(event)
