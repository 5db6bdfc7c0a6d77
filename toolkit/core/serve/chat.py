"""``POST /v1/chat/completions``: the messages rendered by the model's chat template (or
``--chat-template``), ``n`` replies; streamed as ``chat.completion.chunk`` events ending with
``data: [DONE]``, with a last usage chunk when ``stream_options.include_usage`` is set."""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from starlette.requests import Request

from .engine_loop import Delta, RequestGroup, Submission, TokenLogprob
from .errors import ApiError
from .protocol import ChatCompletionRequest
from .sampling import finish_reason, sampling_params, usage
from .streaming import ChunkWriter, EventStreamResponse, unless_disconnected


def _logprob_entry(entry: TokenLogprob) -> dict[str, Any]:
    return {"token": entry.token, "logprob": entry.logprob, "bytes": list(entry.token.encode()),
            "top_logprobs": [{"token": text, "logprob": value, "bytes": list(text.encode())}
                             for _, text, value in entry.top]}


class ChatChoice:
    """One reply, accumulated from its deltas (non-streaming) or turned into chunk deltas (streaming)."""

    def __init__(self, index: int, wants_logprobs: bool):
        self.index, self.wants_logprobs = index, wants_logprobs
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.num_output_tokens = 0

    def add(self, delta: Delta) -> list[dict[str, Any]]:
        self.text.append(delta.text)
        self.num_output_tokens = delta.num_output_tokens
        new_logprobs = [_logprob_entry(entry) for entry in delta.logprobs or []]
        self.logprobs += new_logprobs
        if delta.finished:
            self.finish_reason = finish_reason(delta)
        return new_logprobs

    def chunk_choice(self, delta: Delta, first: bool) -> dict[str, Any] | None:
        """The streamed choice for one delta, or None when it adds nothing."""
        new_logprobs = self.add(delta)
        content = {"role": "assistant", "content": delta.text} if first else {"content": delta.text}
        if not (delta.text or first or delta.finished or new_logprobs):
            return None
        return {"index": self.index, "delta": content if (delta.text or first) else {},
                "logprobs": {"content": new_logprobs} if self.wants_logprobs else None,
                "finish_reason": self.finish_reason if delta.finished else None}

    def message_choice(self) -> dict[str, Any]:
        return {"index": self.index, "message": {"role": "assistant", "content": "".join(self.text)},
                "logprobs": {"content": self.logprobs} if self.wants_logprobs else None,
                "finish_reason": self.finish_reason}


async def create_chat_completion(state, body: ChatCompletionRequest, request: Request):
    model = state.check_model(body.model)
    body.ensure_supported()
    state.check_chat_template()
    limit = body.completion_limit
    if limit is not None and limit < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {limit}",
                       param="max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens")
    encode = state.chat_encoder([message.for_template() for message in body.messages])
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    submissions = [Submission(j, encode, sampling_params(body, j, logprobs=logprobs), limit, prompt_param="messages")
                   for j in range(body.n)]
    group = state.submit(submissions, body.stream)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
    choices = {j: ChatChoice(j, body.logprobs) for j in range(body.n)}
    if body.stream:
        try:
            accepted = await group.start()
        except BaseException:
            group.abort()
            raise
        return EventStreamResponse(_stream(group, choices, head, body, len(accepted[0].prompt_token_ids)), group)

    async def run():
        accepted = await group.start()
        async for delta in group.deltas():
            choices[delta.index].add(delta)
        return len(accepted[0].prompt_token_ids)

    num_prompt_tokens = await unless_disconnected(request, group, run)
    completion_tokens = sum(choice.num_output_tokens for choice in choices.values())
    return {**head, "object": "chat.completion", "choices": [choices[j].message_choice() for j in sorted(choices)],
            "usage": usage(num_prompt_tokens, completion_tokens)}


async def _stream(group: RequestGroup, choices: dict[int, ChatChoice], head: dict, body: ChatCompletionRequest,
                  num_prompt_tokens: int) -> AsyncIterator[str]:
    writer = ChunkWriter({**head, "object": "chat.completion.chunk"},
                         body.stream_options is not None and body.stream_options.include_usage)
    started: set[int] = set()
    async for delta in group.deltas():
        choice = choices[delta.index].chunk_choice(delta, first=delta.index not in started)
        started.add(delta.index)
        if choice is not None:
            yield writer.choice(choice)
    if writer.include_usage:
        completion_tokens = sum(choice.num_output_tokens for choice in choices.values())
        yield writer.usage(usage(num_prompt_tokens, completion_tokens))
