"""Turn a batch of logits into next tokens, one row per sequence, each with its own SamplingParams.

Order (as transformers applies its processors): penalties -> greedy argmax, or temperature
-> top-k -> top-p -> min-p -> draw. Draws use the exponential-race form of categorical
sampling (``argmax(p / E)`` with ``E ~ Exp(1)``), so a seeded request draws its noise from
its own ``torch.Generator`` and gets the same tokens whatever else is in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..argmax import argmax_rows
from .sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """What the sampler needs from one sequence (its token list is shared, not copied)."""

    params: SamplingParams
    token_ids: list[int]
    num_prompt_tokens: int
    generator: torch.Generator | None = None

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]  # sampled token and top-n, from the raw distribution


def to_device(values: list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small host list as a device tensor without waiting for the device: a plain ``torch.tensor(...,
    device=cuda)`` copy synchronises the stream, which would stall the host behind a step running ahead."""
    host = torch.tensor(values, dtype=dtype, pin_memory=torch.device(device).type == "cuda")
    return host.to(device, non_blocking=True)


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Repetition penalty over prompt and output tokens; presence/frequency over output tokens."""
    for i, row in enumerate(rows):
        p = row.params
        if not p.has_penalties:
            continue
        if p.repetition_penalty != 1:
            seen = torch.tensor(row.prompt_token_ids + row.output_token_ids, dtype=torch.long, device=logits.device)
            seen = seen.unique()
            values = logits[i, seen]
            logits[i, seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if row.output_token_ids and (p.presence_penalty or p.frequency_penalty):
            out = torch.tensor(row.output_token_ids, dtype=torch.long, device=logits.device)
            counts = torch.bincount(out, minlength=logits.shape[1]).to(logits.dtype)
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p (rows renormalised)."""
    device = logits.device
    temperature = to_device([p.temperature or 1.0 for p in params], device).unsqueeze(1)
    logits = logits / temperature
    if not any(p.has_filters for p in params):
        return logits.softmax(-1)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[1]
    rank = torch.arange(vocab, device=device).unsqueeze(0)
    top_k = to_device([p.top_k if p.top_k > 0 else vocab for p in params], device).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(rank >= top_k, float("-inf"))
    probs = sorted_logits.softmax(-1)
    top_p = to_device([p.top_p for p in params], device).unsqueeze(1)
    before = probs.cumsum(-1) - probs  # probability mass ranked above each token
    probs = probs.masked_fill((before >= top_p) & (rank > 0), 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    min_p = to_device([p.min_p for p in params], device).unsqueeze(1)
    probs = probs.masked_fill(probs < min_p * probs[:, :1], 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, order, probs)


def draw(probs: torch.Tensor, generators: list[torch.Generator | None],
         shared: torch.Generator | None = None) -> torch.Tensor:
    """One token per row; rows with a generator draw their noise from it alone, the rest from ``shared``."""
    noise = torch.empty_like(probs).exponential_(generator=shared)
    for i, generator in enumerate(generators):
        if generator is not None:
            noise[i].exponential_(generator=generator)
    return (probs / noise).argmax(-1)


def prompt_logprobs(logits: torch.Tensor, next_token_ids: list[int], top_n: int) -> list[dict[int, float]]:
    """Log-probability entries of known tokens: row ``i`` of ``logits`` scored against ``next_token_ids[i]``.

    Each entry maps token id -> log-probability (of the raw distribution) for the given token and
    the ``top_n`` most likely ones, like the sampled tokens' entries.
    """
    raw = logits[:len(next_token_ids)].float().log_softmax(-1)
    targets = torch.tensor(next_token_ids, dtype=torch.long, device=raw.device)
    chosen = raw.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
    top_values, top_ids = raw.topk(top_n, dim=-1) if top_n else (raw[:, :0], targets[:, None][:, :0])
    entries = [dict(zip(ids, values)) for ids, values in zip(top_ids.tolist(), top_values.tolist())]
    for entry, token_id, value in zip(entries, next_token_ids, chosen):
        entry[token_id] = value
    return entries


class Sampler:
    """Samples on ``device``; requests without a seed share one generator seeded with ``seed``."""

    def __init__(self, device: torch.device | str = "cpu", seed: int | None = None):
        self.generator = torch.Generator(device=device)
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
        logits = logits.float()
        wants_logprobs = [r.params.logprobs is not None for r in rows]
        raw_logprobs = logits.log_softmax(-1) if any(wants_logprobs) else None
        if any(r.params.has_penalties for r in rows):
            logits = apply_penalties(logits.clone(), rows)
        chosen = self._choose(logits, rows)
        token_ids = chosen.tolist()
        logprobs = (self._logprobs(raw_logprobs, chosen, token_ids, rows) if raw_logprobs is not None
                    else [None] * len(rows))
        return SampleResult(token_ids, logprobs)

    def choose(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """The next token of every row, left on the logits' device (nothing is read back, so a CUDA
        caller does not wait). Only for rows ``on_device`` accepts."""
        return self._choose(logits.float(), rows)

    @staticmethod
    def on_device(rows: list[SamplingRow]) -> bool:
        """Whether ``choose`` serves these rows: no penalties (they read the token history, which a
        run-ahead step has not got yet) and no log-probabilities (read back with the tokens)."""
        return not any(r.params.has_penalties or r.params.logprobs is not None for r in rows)

    def _choose(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        token_ids = argmax_rows(logits)
        sampled = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if sampled:
            index = to_device(sampled, logits.device)
            probs = filtered_probs(logits[index], [rows[i].params for i in sampled])
            token_ids[index] = draw(probs, [rows[i].generator for i in sampled], self.generator)
        return token_ids

    @staticmethod
    def _logprobs(raw: torch.Tensor, chosen: torch.Tensor, token_ids: list[int],
                  rows: list[SamplingRow]) -> list[dict | None]:
        top_n = max(r.params.logprobs or 0 for r in rows)
        chosen_values = raw.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
        top_values, top_ids = raw.topk(top_n, dim=-1) if top_n else (raw[:, :0], chosen[:, None][:, :0])
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
        out: list[dict | None] = []
        for i, row in enumerate(rows):
            if row.params.logprobs is None:
                out.append(None)
                continue
            n = row.params.logprobs
            entry = dict(zip(top_ids[i][:n], top_values[i][:n]))
            entry[token_ids[i]] = chosen_values[i]
            out.append(entry)
        return out
