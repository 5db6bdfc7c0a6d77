"""What every route shares: the settings, the engine loop, the metrics, and the checks that use them."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable

from .engine_loop import EngineLoop, RequestGroup, Submission
from .errors import ApiError
from .metrics import ServerMetrics

# seconds a client is told to wait when the queue is full (a decode step is milliseconds to
# tens of milliseconds; a second lets hundreds of tokens come out)
RETRY_AFTER_SECONDS = 1


@dataclass
class ServerSettings:
    """
    :param model_names: names ``/v1/models`` lists and ``model`` may take (the first is the default)
    :param api_key: when set, every route but ``/health`` needs ``Authorization: Bearer <api_key>``
    :param max_waiting: most engine requests queued for admission; beyond it requests get a 503
    :param chat_template: a Jinja chat template used instead of the tokenizer's own
    """

    model_names: list[str]
    api_key: str | None = None
    max_waiting: int = 512
    chat_template: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))


class ServerState:
    def __init__(self, llm, settings: ServerSettings):
        self.llm, self.settings = llm, settings
        self.metrics = ServerMetrics()
        self.engine_loop = EngineLoop(llm, observer=self.metrics)
        self.metrics.watch(self.engine_loop)

    @property
    def model_name(self) -> str:
        return self.settings.model_names[0]

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    def check_model(self, name: str | None) -> str:
        """The served name a request asked for (the default when it named none); 404 for another."""
        if name is None:
            return self.model_name
        if name not in self.settings.model_names:
            raise ApiError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")
        return name

    def submit(self, submissions: list[Submission], stream: bool) -> RequestGroup:
        """Hand requests to the engine, or a 503 with Retry-After when the admission queue is full."""
        waiting = self.engine_loop.num_waiting
        if waiting + len(submissions) > self.settings.max_waiting:
            raise ApiError(503, f"The server is overloaded: {waiting} requests are waiting "
                           f"(limit {self.settings.max_waiting}). Retry later.", code="server_overloaded",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        return self.engine_loop.submit(submissions, stream)

    # ---- prompt encoders (run on the engine thread, which alone uses the tokenizer) -----------------
    def text_encoder(self, text: str) -> Callable[[], list[int]]:
        """Token ids of a completion prompt, encoded as ``LLM.generate`` encodes a string (memoised,
        so the ``n`` choices of one prompt encode it once)."""

        @functools.cache
        def encode() -> tuple[int, ...]:
            return tuple(self._tokenizer("prompt").encode(text))

        return lambda: list(encode())

    def chat_encoder(self, messages: list[dict]) -> Callable[[], list[int]]:
        """Token ids of a conversation rendered by the chat template, ready for the assistant's reply."""

        @functools.cache
        def encode() -> tuple[int, ...]:
            tokenizer = self._tokenizer("messages")
            try:
                text = tokenizer.apply_chat_template(messages, chat_template=self.settings.chat_template,
                                                     tokenize=False, add_generation_prompt=True)
            except Exception as exc:  # noqa: BLE001 - a template may raise anything on odd input (roles...)
                raise ApiError(400, f"the chat template failed on these messages: {exc}", param="messages") from exc
            return tuple(tokenizer.encode(text, add_special_tokens=False))

        return lambda: list(encode())

    def check_chat_template(self) -> None:
        """400 when neither the tokenizer nor ``--chat-template`` gives a template."""
        if self.settings.chat_template is None and not self.llm.has_chat_template():
            raise ApiError(400, "This model has no chat template, so /v1/chat/completions cannot format messages. "
                           "Use /v1/completions, or start the server with --chat-template FILE (a Jinja template).",
                           param="messages", code="no_chat_template")

    def _tokenizer(self, param: str):
        if self.llm.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer; send the prompt as token ids", param=param)
        return self.llm.tokenizer
