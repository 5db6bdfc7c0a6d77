"""``LLM``: the public engine API over any loaded model (every format, every scheme, any tp size).

    llm = toolkit.LLM("path/or/hub-id")
    for out in llm.generate(["Hello", "The sky is"], SamplingParams(max_tokens=32, temperature=0)):
        print(out.text)

``generate`` and ``stream`` drive the step-level interface (``add_request``, ``step``,
``has_unfinished_requests``, ``abort``) that callers can also use themselves.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Iterator, Sequence as Seq

import torch

from ..errors import ToolkitError
from ..loaded import LoadedModel
from ..threads import CoreShare
from .block_manager import BlockManager
from .executor import LocalExecutor, ParallelExecutor
from .kv_cache import parse_memory
from .model_runner import RunnerConfig, StepInput
from .outputs import Detokenizer, RequestOutput, check_stop_token
from .run_ahead import PendingStep, ahead_input_ids, ahead_items
from .sampler import Sampler, SamplingRow, prompt_logprobs
from .sampling_params import SamplingParams
from .scheduler import RequestTooLargeError, Scheduler, SchedulerOutput
from .sequence import Sequence
from .state_pool import StatePool

logger = logging.getLogger("toolkit.engine")

Prompt = str | Seq[int]


class MissingChatTemplateError(ToolkitError, ValueError):
    """A chat was asked of a model whose tokenizer has no chat template."""


class LLM:
    """A batching engine bound to one model.

    :param model: a model reference for ``toolkit.load`` (path, hub id) or an already loaded model
        (``LoadedModel`` or a tensor-parallel handle); ``format``/``quant``/``dtype``/``device``/``tp``
        are passed to ``toolkit.load`` when a reference is given
    :param max_num_seqs: most sequences running at once
    :param max_num_batched_tokens: token budget of one step (long prompts are prefilled in chunks)
    :param kv_cache_memory: bytes (or ``"4GiB"``) for the KV cache per rank; default: what fits in
        ``gpu_memory_utilization`` of the GPU, or 256 MiB on CPU
    :param block_size: tokens per KV block
    :param enable_prefix_caching: reuse KV blocks of identical prompt prefixes across requests (switched
        off for models with recurrent layers: their state at a block boundary is not kept, so a cached
        prefix's KV alone could not resume them)
    :param max_model_len: longest sequence (default: the model's max_position_embeddings)
    :param enforce_eager: no CUDA graphs for decode steps
    :param seed: seed for requests without their own (default: random; 0 under a launcher, so ranks agree)
    :param run_ahead: launch the next decode step before reading this one's tokens, so the host's work
        overlaps the GPU's (engine/run_ahead.py; same tokens). Default: on for a model on a CUDA device
        in this process, off otherwise; ``TOOLKIT_RUN_AHEAD=0|1`` sets the default

    Driving a tensor-parallel handle (``tp > 1`` from one process), the engine lowers this
    process's torch threads to ``CALLER_THREADS_WITH_WORKERS`` (see there why).
    """

    def __init__(self, model, format: str | None = None, quant: str | None = None, dtype=None, device=None,
                 tp: int = 1, *, max_num_seqs: int = 256, max_num_batched_tokens: int = 4096,
                 kv_cache_memory: int | str | None = None, block_size: int = 16, enable_prefix_caching: bool = True,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.9, enforce_eager: bool = False,
                 seed: int | None = None, run_ahead: bool | None = None):
        self._owns_model = isinstance(model, (str, os.PathLike))
        if self._owns_model:
            from ..api import load  # noqa: PLC0415 - the engine module itself needs no loader

            model = load(model, format=format, quant=quant, dtype=dtype, device=device, tp=tp)
        self.loaded, self.config, self.tokenizer = model, model.config, model.tokenizer
        self.max_model_len = min(max_model_len or model.config.max_position_embeddings,
                                 model.config.max_position_embeddings)
        self.eos_token_ids = tuple(model.config.eos_token_ids) or _tokenizer_eos(self.tokenizer)
        runner_config = RunnerConfig(block_size=block_size, max_num_seqs=max_num_seqs,
                                     max_num_batched_tokens=max_num_batched_tokens, max_model_len=self.max_model_len,
                                     kv_cache_memory=parse_memory(kv_cache_memory),
                                     gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager)
        is_local = isinstance(model, LoadedModel)
        if not is_local:
            _cap_caller_threads()
        self.executor = (LocalExecutor if is_local else ParallelExecutor)(model, runner_config)
        self.device = torch.device(model.device) if is_local else torch.device("cpu")
        self._cores = CoreShare() if is_local and self.device.type == "cpu" else None  # threads that fit free cores
        self.block_size = block_size
        # recurrent layers: the scheduler hands out slot ids; the state tensors live in the runner(s)
        self.state_pool = StatePool(self.executor.num_slots, {}) if self.executor.num_slots else None
        if self.state_pool is not None and enable_prefix_caching:
            logger.info("prefix caching is off: this model has recurrent layers, whose state cannot be "
                        "resumed from cached KV blocks")
            enable_prefix_caching = False
        self.block_manager = BlockManager(self.executor.num_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens, max_model_len=self.max_model_len,
                                   state_pool=self.state_pool)
        logger.info("engine cache: %s", format_memory_report(self.memory_report()))
        self.sampler = Sampler(self.device, seed=_default_seed(seed, model))
        self.detokenizer = Detokenizer(self.tokenizer)
        # run ahead (engine/run_ahead.py) by default where the model and sampling live on one CUDA device
        if run_ahead is None:
            setting = os.environ.get("TOOLKIT_RUN_AHEAD")
            run_ahead = is_local and (setting == "1" if setting in ("0", "1") else self.device.type == "cuda")
        self.run_ahead = bool(run_ahead)
        if self.run_ahead and not is_local:
            raise ValueError("run_ahead needs a model in this process (a tensor-parallel handle returns logits to the host)")
        self._ahead: PendingStep | None = None
        self._requests: dict[str, Sequence] = {}
        self._streaming: set[str] = set()
        self._ids = itertools.count()

    # ---- step-level interface -------------------------------------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
                    *, stream: bool = False) -> str:
        """Queue a request; returns its id. With ``stream``, every step's output carries the text so far."""
        params = params or SamplingParams()
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, token_ids = (prompt, self._encode(prompt)) if isinstance(prompt, str) else (None, [int(t) for t in prompt])
        if not token_ids:
            raise ValueError("the prompt is empty")
        if min(token_ids) < 0 or max(token_ids) >= self.config.vocab_size:
            raise ValueError(f"request {request_id!r}: prompt token ids must lie in [0, {self.config.vocab_size})")
        if len(token_ids) >= self.max_model_len:
            raise RequestTooLargeError(f"request {request_id!r}: the prompt has {len(token_ids)} tokens, but the "
                                       f"model's maximum length is {self.max_model_len}")
        seq = Sequence(request_id, token_ids, params, self.block_size, prompt=text)
        self.scheduler.add(seq)
        self._requests[request_id] = seq
        if stream:
            self._streaming.add(request_id)
        return request_id

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks (unknown or finished ids are ignored)."""
        seq = self._requests.pop(request_id, None)
        if seq is not None and not seq.is_finished:
            self.scheduler.finish(seq, "abort")
        self._streaming.discard(request_id)

    def step(self) -> list[RequestOutput]:
        """Run one batch; returns an output for every request that produced a token (or finished).

        With ``run_ahead`` the next batch may already be on the GPU when this returns (see
        engine/run_ahead.py); the tokens and outputs are the same as without it."""
        if self._cores is not None:
            self._cores.adjust()
        pending, self._ahead = self._ahead, None
        if pending is None or pending.is_stale:  # a stale step's sequences all ended: drop its tokens
            scheduled = self.scheduler.schedule()
            if scheduled.is_empty:
                return []
            pending = self._launch(scheduled)
        if self.run_ahead and (items := ahead_items(pending, self.scheduler, self.max_model_len)):
            input_ids = ahead_input_ids(pending, items)
            self._ahead = self._launch(self.scheduler.schedule_ahead(items), input_ids)
        return self._complete(pending)

    def _launch(self, scheduled: SchedulerOutput, input_ids: torch.Tensor | None = None) -> PendingStep:
        """Run the model on ``scheduled`` and sample; with ``run_ahead`` the tokens stay on the device."""
        step_input = self._step_input(scheduled, input_ids)
        logits = self.executor.execute(step_input)
        sampling = [item.seq for item in scheduled.scheduled if item.samples]
        if step_input.all_logits_rows:
            self._record_prompt_logprobs(scheduled, step_input, logits[len(sampling):])
            logits = logits[:len(sampling)]
        if not sampling:  # a prefill chunk that ends inside its prompt
            return PendingStep(scheduled, sampling, token_ids=[])
        rows = [self._sampling_row(seq) for seq in sampling]
        if self.run_ahead and self.sampler.on_device(rows):
            return PendingStep.on_device(scheduled, sampling, self.sampler.choose(logits, rows))
        result = self.sampler(logits, rows)
        return PendingStep(scheduled, sampling, token_ids=result.token_ids, logprobs=result.logprobs)

    def _complete(self, pending: PendingStep) -> list[RequestOutput]:
        """Read the step's tokens, advance its sequences (or fill in what running ahead left) and report them."""
        tokens = iter(pending.read())
        self.scheduler.update(pending.scheduled, [next(tokens) if item.samples else None
                                                  for item in pending.scheduled.scheduled])
        logprobs = pending.logprobs or [None] * len(pending.sampling)
        # a sequence that ended with the step before (its row here was computed ahead) or was aborted reports nothing
        return [self._after_token(seq, entry) for seq, entry in zip(pending.sampling, logprobs) if not seq.is_finished]

    # ---- whole-batch interface ------------------------------------------------------------------
    def generate(self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in prompt order."""
        ids = self._add_all(prompts, params, stream=False)
        done: dict[str, RequestOutput] = {}
        try:
            while len(done) < len(ids):
                done.update((o.request_id, o) for o in self.step() if o.finished and o.request_id in ids)
        finally:
            for request_id in ids:
                self.abort(request_id)  # no-op for finished ones; frees the rest if interrupted
        return [done[request_id] for request_id in ids]

    def stream(self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None
               ) -> Iterator[RequestOutput]:
        """Yield each request's increments (``new_text``, ``new_token_ids``) as they are produced."""
        ids = set(self._add_all(prompts, params, stream=True))
        pending = set(ids)
        try:
            while pending:
                for out in self.step():
                    if out.request_id not in ids:
                        continue
                    if out.finished:
                        pending.discard(out.request_id)
                    yield out
        finally:
            for request_id in ids:
                self.abort(request_id)

    def chat(self, messages: list[dict] | list[list[dict]], params: SamplingParams | None = None
             ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of ``{"role", "content"}``) or several."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        return self.generate([self.chat_prompt(c) for c in conversations], params)

    def has_chat_template(self) -> bool:
        """Whether the tokenizer carries a chat template (base models and many GGUFs do not)."""
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation rendered by the tokenizer's chat template, ready for a reply."""
        if not self.has_chat_template():
            raise MissingChatTemplateError("this model's tokenizer has no chat template; use generate() with a plain "
                                           "prompt, or render the conversation yourself (toolkit chat falls back to "
                                           "engine/plain_chat.py's format)")
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def stats(self) -> dict[str, float]:
        """Prefix-cache hits, preemptions and KV blocks, for reports and tests."""
        cache = self.block_manager.stats
        return {"prefix_cache_queried_tokens": cache.queried_tokens, "prefix_cache_hit_tokens": cache.hit_tokens,
                "prefix_cache_hit_rate": cache.hit_rate, "num_preemptions": self.scheduler.num_preemptions,
                "num_blocks": self.block_manager.num_blocks, "num_free_blocks": self.block_manager.num_free_blocks}

    def memory_report(self) -> dict:
        """The cache of one rank: ``kv_cache_bytes`` and ``kv_tokens`` (paged KV of the attention layers
        only), ``state_bytes`` and ``state_slots`` (one recurrent-state slot per running sequence, plus a
        null slot counted in the bytes), the budget they share, and per-token / per-slot sizes."""
        return dict(self.executor.memory_report(), prefix_caching=self.block_manager.enable_prefix_caching)

    def close(self) -> None:
        """Release the KV cache (and the model's workers if this engine loaded it)."""
        if self._ahead is not None:  # let the step run ahead finish before its cache goes
            self._ahead.read()
            self._ahead = None
        self.executor.close()
        if self._owns_model:
            self.loaded.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---- internals ------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer; pass prompts as token ids")
        return list(self.tokenizer.encode(text))

    def _add_all(self, prompts, params, *, stream: bool) -> list[str]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        return [self.add_request(prompt, p, stream=stream) for prompt, p in zip(prompts, params)]

    def _step_input(self, scheduled: SchedulerOutput, input_ids: torch.Tensor | None = None) -> StepInput:
        items = scheduled.scheduled
        pool = self.state_pool
        return StepInput(
            token_ids=[t for i in items for t in i.seq.token_ids[i.start:i.start + i.num_new_tokens]],
            query_lens=[i.num_new_tokens for i in items], starts=[i.start for i in items],
            block_tables=[i.seq.block_table for i in items],
            sample_rows=[row for row, i in enumerate(items) if i.samples],
            all_logits_rows=[row for row, i in enumerate(items) if i.seq.wants_prompt_logprobs],
            state_slots=None if pool is None else [pool.slot_of(i.seq.request_id) for i in items],
            input_ids=input_ids)

    @staticmethod
    def _record_prompt_logprobs(scheduled: SchedulerOutput, step_input: StepInput, logits: torch.Tensor) -> None:
        """Score each chunk's prompt tokens with the logits of the positions before them."""
        offset = 0
        for row in step_input.all_logits_rows:
            item = scheduled.scheduled[row]
            seq, chunk = item.seq, logits[offset:offset + item.num_new_tokens]
            offset += item.num_new_tokens
            first = len(seq.prompt_logprobs)  # the next prompt token without an entry
            targets = seq.prompt_token_ids[first:item.start + item.num_new_tokens + 1]
            if targets and first >= item.start + 1:  # chunks arrive in order; anything else is a recompute
                seq.prompt_logprobs += prompt_logprobs(chunk[first - 1 - item.start:], targets,
                                                       seq.params.prompt_logprobs)

    def _sampling_row(self, seq: Sequence) -> SamplingRow:
        if seq.params.seed is not None and seq.generator is None:
            seq.generator = torch.Generator(device=self.device).manual_seed(seq.params.seed)
        return SamplingRow(seq.params, seq.token_ids, seq.num_prompt_tokens, seq.generator)

    def _after_token(self, seq: Sequence, logprobs: dict | None) -> RequestOutput:
        """Record the token just appended, decide whether the request is done, report it."""
        seq.first_token_time = seq.first_token_time or time.perf_counter()
        if logprobs is not None:
            seq.logprobs.append(logprobs)
        new_text = ""
        finished = check_stop_token(seq, self.eos_token_ids, self.max_model_len)
        if finished or seq.params.stop or seq.request_id in self._streaming:
            new_text = self.detokenizer.update(seq, finishing=finished)
            finished = seq.finish_reason is not None
        if finished:
            self.scheduler.finish(seq, seq.finish_reason)
            self._requests.pop(seq.request_id, None)
            self._streaming.discard(seq.request_id)
        return self._output(seq, new_text, finished)

    @staticmethod
    def _output(seq: Sequence, new_text: str, finished: bool) -> RequestOutput:
        now = time.perf_counter()
        metrics = {"ttft": seq.first_token_time - seq.arrival_time}
        if finished:
            metrics["latency"] = now - seq.arrival_time
        return RequestOutput(
            request_id=seq.request_id, prompt=seq.prompt, prompt_token_ids=seq.prompt_token_ids,
            text=seq.text, token_ids=seq.output_token_ids, finished=finished, finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason, new_text=new_text, new_token_ids=seq.token_ids[-1:],
            logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
            prompt_logprobs=list(seq.prompt_logprobs) if seq.params.prompt_logprobs is not None else None,
            num_cached_tokens=seq.num_cached_tokens, metrics=metrics)


def format_memory_report(report: dict) -> str:
    """One line: KV bytes/tokens for attention layers, state bytes/slots for recurrent layers."""
    mib = 2 ** 20
    line = (f"KV {report['kv_cache_bytes'] / mib:.1f} MiB = {report['kv_tokens']} tokens "
            f"({report['attention_layers']} attention layers)")
    if report.get("recurrent_layers"):
        line += (f"; recurrent state {report['state_bytes'] / mib:.1f} MiB = {report['state_slots']} slots "
                 f"({report['recurrent_layers']} recurrent layers)")
    if report.get("budget_bytes") is not None:
        line += f"; budget {report['budget_bytes'] / mib:.1f} MiB"
    return line


def _tokenizer_eos(tokenizer) -> tuple[int, ...]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return () if eos is None else (int(eos),)


def _default_seed(seed: int | None, model) -> int:
    """Unseeded requests draw from one engine generator; ranks under a launcher must agree on it."""
    if seed is not None:
        return seed
    launched = getattr(getattr(model, "parallel", None), "tp_size", 1) > 1
    return 0 if launched else int.from_bytes(os.urandom(4), "little")


# With the model in worker processes, this process only schedules and samples. Its OpenMP
# threads (one per core by default) spin after each parallel region and take the cores the
# workers launch kernels from: on 2x H200 (452M Llama, batch 8) a decode step took 13.6 ms with
# 32 threads here, 5.6 ms with 4, 6.9 ms with 1.
CALLER_THREADS_WITH_WORKERS = 4


def _cap_caller_threads() -> None:
    """Lower (never raise) this process's torch intra-op threads to CALLER_THREADS_WITH_WORKERS."""
    if torch.get_num_threads() > CALLER_THREADS_WITH_WORKERS:
        torch.set_num_threads(CALLER_THREADS_WITH_WORKERS)
