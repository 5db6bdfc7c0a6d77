"""What the engine hands back: RequestOutput, and the text/stop bookkeeping behind it."""
from __future__ import annotations

from dataclasses import dataclass, field

from .sequence import Sequence


@dataclass
class RequestOutput:
    """A request's result so far (``finished`` once it is done).

    ``text``/``token_ids`` are everything generated so far; ``new_text``/``new_token_ids`` what
    this step added (what ``LLM.stream`` consumers print). ``token_ids`` keep a stop token,
    ``text`` never shows it nor a stop string.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None = None        # "stop", "length" or "abort"
    stop_reason: int | str | None = None    # the stop token id or stop string that ended it
    new_text: str = ""
    new_token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None  # first entry None (nothing precedes it)
    num_cached_tokens: int = 0              # prompt tokens served from the prefix cache
    metrics: dict[str, float] = field(default_factory=dict)


def check_stop_token(seq: Sequence, eos_token_ids: tuple[int, ...], max_model_len: int) -> bool:
    """Finish reason from the last token (stop ids, end of sequence, length); True if finished."""
    params, last = seq.params, seq.token_ids[-1]
    if last in params.stop_token_ids or (not params.ignore_eos and last in eos_token_ids):
        seq.finish_reason, seq.stop_reason = "stop", last
    elif seq.num_output_tokens >= params.max_tokens or len(seq) >= max_model_len:
        seq.finish_reason = "length"
    return seq.finish_reason is not None


class Detokenizer:
    """Output text for sequences, with stop strings. Decodes the whole output each time (exact for
    every tokenizer, cheap for chat-length outputs); sequences that neither stream nor have stop
    strings are decoded once, when they finish."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, seq: Sequence) -> str:
        if self.tokenizer is None:
            return ""
        ids = seq.output_token_ids
        if seq.finish_reason == "stop" and isinstance(seq.stop_reason, int):
            ids = ids[:-1]  # the stop token is not part of the text
        return self.tokenizer.decode(ids, skip_special_tokens=seq.params.skip_special_tokens)

    def update(self, seq: Sequence, *, finishing: bool) -> str:
        """Refresh ``seq.text``; returns the new text. Sets finish_reason when a stop string appears."""
        text = self.decode(seq)
        if not finishing and text.endswith("\ufffd"):
            return ""  # an incomplete multi-byte character: wait for the rest of it
        stop_at = self._find_stop(seq, text)
        if stop_at is not None:
            text = text[:stop_at[0]]
            seq.finish_reason, seq.stop_reason = "stop", stop_at[1]
        previous = seq.text
        seq.text = text
        return text[len(previous):] if text.startswith(previous) else text

    @staticmethod
    def _find_stop(seq: Sequence, text: str) -> tuple[int, str] | None:
        stops = seq.params.stop
        if not stops:
            return None
        start = max(0, len(seq.text) - max(len(s) for s in stops))  # only text that just changed
        found = [(text.find(stop, start), stop) for stop in stops]
        found = [(index, stop) for index, stop in found if index >= 0]
        return min(found) if found else None
