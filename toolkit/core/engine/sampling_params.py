"""SamplingParams: how one request picks its tokens and when it stops."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Per-request sampling and stopping choices.

    :param max_tokens: most new tokens to generate
    :param temperature: 0 means greedy (argmax after penalties)
    :param top_k: keep the k most likely tokens (0 or -1: all)
    :param top_p: keep the smallest set whose probability reaches top_p (1.0: all)
    :param min_p: drop tokens less likely than ``min_p`` times the most likely one (0: none)
    :param repetition_penalty: >1 discourages every token seen in the prompt or output
        (positive logits divided, negative multiplied), as in transformers
    :param presence_penalty: subtracted once from the logit of every token already generated
    :param frequency_penalty: subtracted per occurrence of a token already generated
    :param seed: per-request seed; the same seed gives the same tokens whatever the batch
    :param stop: strings that end generation; the text stops before them
    :param stop_token_ids: token ids that end generation (kept in ``token_ids``, not in text)
    :param ignore_eos: keep going past the model's end-of-sequence tokens
    :param logprobs: also return the log-probabilities of the sampled token and this many top ones
        (of the model's raw distribution, before penalties and temperature)
    :param skip_special_tokens: drop special tokens when decoding text
    :param prompt_logprobs: also return, for every prompt token after the first, its log-probability
        given the tokens before it and this many top ones (for scoring, e.g. loglikelihood evals);
        such a request computes its whole prompt, skipping the prefix cache, whose tokens have no logits
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop, self.stop_token_ids = list(self.stop), [int(t) for t in self.stop_token_ids]
        checks = ((self.max_tokens >= 1, "max_tokens must be >= 1"),
                  (self.temperature >= 0, "temperature must be >= 0"),
                  (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
                  (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
                  (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
                  (self.logprobs is None or self.logprobs >= 0, "logprobs must be >= 0"),
                  (self.prompt_logprobs is None or self.prompt_logprobs >= 0, "prompt_logprobs must be >= 0"))
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{message} (got {self})")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def has_filters(self) -> bool:
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0
