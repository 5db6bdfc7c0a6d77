"""Request bodies of the OpenAI API routes, as pydantic models.

Unknown top-level fields are rejected (``extra="forbid"``), as OpenAI does ("Unrecognized
request argument supplied"). Fields OpenAI defines but this server does not implement are
accepted only at their neutral value (``ensure_supported`` says which one was set). Beyond
OpenAI's fields, the sampling extensions other OpenAI-compatible servers take (``top_k``,
``min_p``, ``repetition_penalty``, ``ignore_eos``, ``stop_token_ids``, ``skip_special_tokens``)
are accepted too.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from .errors import ApiError

MAX_LOGPROBS = 20


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(StrictModel):
    include_usage: bool = False
    include_obfuscation: bool = False  # OpenAI's padding of stream chunks; there is nothing to pad here


class SamplingFields(StrictModel):
    """Fields both routes share."""

    model: Optional[str] = None
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    stop: Optional[Union[str, list[str]]] = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    seed: Optional[int] = None
    user: Optional[str] = None
    logit_bias: Optional[dict[str, float]] = None
    # extensions
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    ignore_eos: bool = False
    stop_token_ids: Optional[list[int]] = None
    skip_special_tokens: bool = True

    def unsupported(self) -> dict[str, Any]:
        """Fields set to something this server cannot honour (name -> value)."""
        return {"logit_bias": self.logit_bias} if self.logit_bias else {}

    def ensure_supported(self) -> None:
        for name, value in self.unsupported().items():
            raise ApiError(400, f"{name}={value!r} is not supported by this server", param=name)

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a list of strings, token ids, or a list of those."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = 16
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    def unsupported(self) -> dict[str, Any]:
        found = super().unsupported()
        if self.best_of is not None and self.best_of != self.n:
            found["best_of"] = self.best_of
        if self.suffix:
            found["suffix"] = self.suffix
        return found

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list (one string or one list of token ids each)."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]
        if not prompt:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        return list(prompt)


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message; fields beyond role/content (``name``, ``tool_calls``...) go to the chat template as given."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: Optional[Union[str, list[TextPart]]] = None

    def for_template(self) -> dict[str, Any]:
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            message["content"] = "".join(part.text for part in self.content)
        return message


class ResponseFormat(StrictModel):
    type: str = "text"


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None
    reasoning_effort: Optional[str] = None

    def unsupported(self) -> dict[str, Any]:
        found = super().unsupported()
        if self.tools:
            found["tools"] = "(tool definitions)"
        if self.tool_choice not in (None, "none", "auto"):
            found["tool_choice"] = self.tool_choice
        if self.response_format is not None and self.response_format.type != "text":
            found["response_format"] = self.response_format.type
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        return found

    @property
    def completion_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
