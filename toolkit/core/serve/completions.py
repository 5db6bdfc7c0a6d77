"""``POST /v1/completions``: text completion of one or several prompts, ``n`` choices each.

Choice ``i * n + j`` is the ``j``-th completion of prompt ``i``. With ``echo`` the prompt comes
back in front of the text, and with ``logprobs`` too, every prompt token but the first is
scored (``token_logprobs[0]`` is None), which is what loglikelihood evaluations read.
``max_tokens: 0`` with ``echo`` scores the prompt without generating.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from starlette.requests import Request

from ..engine.sampling_params import SamplingParams
from .engine_loop import Accepted, Delta, RequestGroup, Submission
from .errors import ApiError
from .protocol import CompletionRequest
from .sampling import finish_reason, sampling_params, usage
from .streaming import ChunkWriter, EventStreamResponse, unless_disconnected


class CompletionChoice:
    """One choice's text and legacy logprobs, built from its deltas (all at once, or piece by piece)."""

    def __init__(self, index: int, accepted: Accepted, prompt: str | list[int], request: CompletionRequest):
        self.index, self.request = index, request
        self.prompt_text = prompt if isinstance(prompt, str) else accepted.prompt_text
        self.accepted = accepted
        self.scores_only = request.max_tokens == 0  # the sampled token is not part of the answer
        self.offset = 0  # text_offset of the next token
        self.started = False
        self.num_output_tokens = 0

    def piece(self, delta: Delta) -> dict[str, Any]:
        """The choice's part of one delta: ``{"index", "text", "logprobs", "finish_reason"}``."""
        text, logprobs = "", self._empty_logprobs()
        if not self.started and self.request.echo:
            text += self.prompt_text or ""
            self._add_prompt_logprobs(logprobs, delta)
        self.started = True
        if not self.scores_only:
            text += delta.text
            self.num_output_tokens = delta.num_output_tokens
            for entry in delta.logprobs or []:
                self._add(logprobs, entry.token, entry.logprob, {t: v for _, t, v in entry.top})
        return {"index": self.index, "text": text,
                "logprobs": logprobs if self.request.logprobs is not None else None,
                "finish_reason": finish_reason(delta, self.scores_only) if delta.finished else None}

    @staticmethod
    def _empty_logprobs() -> dict[str, list]:
        return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def _add_prompt_logprobs(self, logprobs: dict[str, list], delta: Delta) -> None:
        if self.request.logprobs is None:
            return
        entries = delta.prompt_logprobs or [None] * len(self.accepted.prompt_token_ids)
        for token, entry in zip(self.accepted.prompt_tokens, entries):
            if entry is None:
                self._add(logprobs, token, None, None)
            else:
                self._add(logprobs, token, entry.logprob, {t: v for _, t, v in entry.top})

    def _add(self, logprobs: dict[str, list], token: str, value: float | None, top: dict | None) -> None:
        logprobs["tokens"].append(token)
        logprobs["token_logprobs"].append(value)
        logprobs["top_logprobs"].append(top)
        logprobs["text_offset"].append(self.offset)
        self.offset += len(token)


def merge(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """One choice from its pieces, in order."""
    merged = dict(pieces[-1], text="".join(p["text"] for p in pieces))
    if merged["logprobs"] is not None:
        merged["logprobs"] = {key: [v for p in pieces for v in p["logprobs"][key]] for key in pieces[0]["logprobs"]}
    return merged


async def create_completion(state, body: CompletionRequest, request: Request):
    model = state.check_model(body.model)
    body.ensure_supported()
    if body.max_tokens is not None and body.max_tokens < 0:
        raise ApiError(400, f"max_tokens must be at least 0, got {body.max_tokens}", param="max_tokens")
    if body.max_tokens == 0 and not body.echo:
        raise ApiError(400, "max_tokens=0 is only allowed with echo=true (to score the prompt)", param="max_tokens")
    prompts = body.prompts()
    submissions = [Submission(i * body.n + j, _encoder(state, prompt), _params(body, j), body.max_tokens, body.echo)
                   for i, prompt in enumerate(prompts) for j in range(body.n)]
    group = state.submit(submissions, body.stream)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model}

    def choices_of(accepted: dict[int, Accepted]) -> dict[int, CompletionChoice]:
        return {s.index: CompletionChoice(s.index, accepted[s.index], prompts[s.index // body.n], body)
                for s in submissions}

    def prompt_tokens(accepted: dict[int, Accepted]) -> int:  # each prompt once, whatever n
        return sum(len(accepted[i * body.n].prompt_token_ids) for i in range(len(prompts)))

    if body.stream:
        accepted = await _start(group)
        return EventStreamResponse(_stream(group, choices_of(accepted), head, body, prompt_tokens(accepted)), group)

    async def run():
        accepted = await group.start()
        choices = choices_of(accepted)
        return accepted, choices, await _collect(group, choices)

    accepted, choices, pieces = await unless_disconnected(request, group, run)
    completion_tokens = sum(choice.num_output_tokens for choice in choices.values())
    return {**head, "choices": [merge(pieces[i]) for i in sorted(pieces)],
            "usage": usage(prompt_tokens(accepted), completion_tokens)}


async def _start(group: RequestGroup):
    try:
        return await group.start()
    except BaseException:
        group.abort()
        raise


async def _collect(group: RequestGroup, choices: dict[int, CompletionChoice]) -> dict[int, list[dict]]:
    pieces: dict[int, list[dict]] = {index: [] for index in choices}
    async for delta in group.deltas():
        pieces[delta.index].append(choices[delta.index].piece(delta))
    return pieces


async def _stream(group: RequestGroup, choices: dict[int, CompletionChoice], head: dict, body: CompletionRequest,
                  num_prompt_tokens: int) -> AsyncIterator[str]:
    writer = ChunkWriter(head, body.stream_options is not None and body.stream_options.include_usage)
    async for delta in group.deltas():
        piece = choices[delta.index].piece(delta)
        if piece["text"] or piece["finish_reason"] or (piece["logprobs"] and piece["logprobs"]["tokens"]):
            yield writer.choice(piece)
    if writer.include_usage:
        completion_tokens = sum(choice.num_output_tokens for choice in choices.values())
        yield writer.usage(usage(num_prompt_tokens, completion_tokens))


def _encoder(state, prompt: str | list[int]):
    if isinstance(prompt, str):
        return state.text_encoder(prompt)
    ids = list(prompt)
    return lambda: ids


def _params(body: CompletionRequest, choice: int) -> SamplingParams:
    prompt_logprobs = body.logprobs if body.echo and body.logprobs is not None else None
    return sampling_params(body, choice, logprobs=body.logprobs, prompt_logprobs=prompt_logprobs)
