"""The sampler against a deliberately plain per-row reference on fixed logits."""
from __future__ import annotations

import math

import pytest
import torch

from toolkit.core.engine.sampler import Sampler, SamplingRow, apply_penalties, draw, filtered_probs
from toolkit.core.engine.sampling_params import SamplingParams

VOCAB = 50


# ---- the reference: one row at a time, Python lists, no tricks -------------------------------------
def ref_penalties(logits: list[float], prompt: list[int], output: list[int], p: SamplingParams) -> list[float]:
    out = list(logits)
    for token in set(prompt) | set(output):
        if p.repetition_penalty != 1:
            out[token] = out[token] / p.repetition_penalty if out[token] > 0 else out[token] * p.repetition_penalty
    for token in set(output):
        count = output.count(token)
        out[token] -= p.frequency_penalty * count + p.presence_penalty
    return out


def ref_probs(logits: list[float], p: SamplingParams) -> list[float]:
    scaled = [x / p.temperature for x in logits]
    keep = set(range(len(scaled)))
    if p.top_k > 0:
        keep = set(sorted(keep, key=lambda t: -scaled[t])[:p.top_k])
    probs = softmax_over(scaled, keep)
    if p.top_p < 1:
        kept, mass = set(), 0.0
        for token in sorted(keep, key=lambda t: -probs[t]):
            kept.add(token)
            mass += probs[token]
            if mass >= p.top_p:
                break
        keep = kept
        probs = softmax_over(scaled, keep)
    if p.min_p > 0:
        top = max(probs)
        keep = {t for t in keep if probs[t] >= p.min_p * top}
        probs = softmax_over(scaled, keep)
    return probs


def softmax_over(logits: list[float], keep: set[int]) -> list[float]:
    top = max(logits[t] for t in keep)
    weights = [math.exp(logits[t] - top) if t in keep else 0.0 for t in range(len(logits))]
    total = sum(weights)
    return [w / total for w in weights]


# ---- tests --------------------------------------------------------------------------------------
def fixed_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float() * 3


PARAM_SETS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.5, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, min_p=0.1),
    SamplingParams(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=2.0, top_k=1),
    SamplingParams(temperature=1.0, top_p=0.01),
]


def test_filtered_probabilities_match_reference():
    logits = fixed_logits(len(PARAM_SETS))
    probs = filtered_probs(logits, PARAM_SETS)
    for row, params in enumerate(PARAM_SETS):
        expected = torch.tensor(ref_probs(logits[row].tolist(), params))
        torch.testing.assert_close(probs[row], expected, atol=1e-6, rtol=1e-5, msg=str(params))


@pytest.mark.parametrize("params", [SamplingParams(repetition_penalty=1.7), SamplingParams(presence_penalty=0.8),
                                    SamplingParams(frequency_penalty=0.4),
                                    SamplingParams(repetition_penalty=0.8, presence_penalty=-0.5,
                                                   frequency_penalty=0.3)])
def test_penalties_match_reference(params):
    logits = fixed_logits(2, seed=1)
    prompt, output = [3, 7, 7, 11], [7, 20, 20, 20, 42]
    rows = [SamplingRow(params, prompt + output, len(prompt)), SamplingRow(SamplingParams(), [1, 2], 2)]
    got = apply_penalties(logits.clone(), rows)
    expected = torch.tensor(ref_penalties(logits[0].tolist(), prompt, output, params))
    torch.testing.assert_close(got[0], expected)
    torch.testing.assert_close(got[1], logits[1])  # a row without penalties is untouched


def test_greedy_is_argmax_after_penalties():
    logits = fixed_logits(3, seed=2)
    top = logits.argmax(-1).tolist()
    rows = [SamplingRow(SamplingParams(temperature=0), [0], 1),
            SamplingRow(SamplingParams(temperature=0, repetition_penalty=1e6), [top[1]], 1),  # bans its top token
            SamplingRow(SamplingParams(temperature=0, presence_penalty=1e6), [5, top[2]], 1)]
    result = Sampler(seed=0)(logits.clone(), rows)
    assert result.token_ids[0] == top[0]
    assert result.token_ids[1] == ref_argmax(ref_penalties(logits[1].tolist(), [top[1]], [], rows[1].params))
    assert result.token_ids[2] != top[2]


def ref_argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda t: values[t])


def test_draws_follow_the_filtered_distribution():
    probs = torch.tensor(ref_probs(fixed_logits(1, seed=3)[0].tolist(), SamplingParams(top_k=6)))
    draws = 40_000
    tokens = draw(probs.expand(draws, -1).contiguous(), [None] * draws, torch.Generator().manual_seed(0))
    frequencies = torch.bincount(tokens, minlength=VOCAB).double() / draws
    assert set(tokens.unique().tolist()) <= set(probs.nonzero().flatten().tolist())
    assert (frequencies - probs.double()).abs().max() < 0.01


def test_seeded_rows_are_reproducible_whatever_the_batch():
    logits = fixed_logits(4, seed=4)
    params = SamplingParams(temperature=1.0, seed=1234)

    def sample(rows_logits, position):
        rows = [SamplingRow(SamplingParams(temperature=1.0), [0], 1) for _ in range(len(rows_logits))]
        rows[position] = SamplingRow(params, [0], 1, torch.Generator().manual_seed(1234))
        return Sampler(seed=None)(rows_logits.clone(), rows).token_ids[position]  # unseeded rows: fresh noise

    alone = [sample(logits[:1], 0) for _ in range(3)]
    in_batch = sample(torch.cat([logits[1:], logits[:1]]), 3)
    assert alone == [alone[0]] * 3 and in_batch == alone[0]
    generator = torch.Generator().manual_seed(1234)
    sequence_a = [Sampler(seed=0)(logits[:1].clone(), [SamplingRow(params, [0], 1, generator)]).token_ids[0]
                  for _ in range(20)]
    generator = torch.Generator().manual_seed(1234)
    sequence_b = [Sampler(seed=99)(logits[:1].clone(), [SamplingRow(params, [0], 1, generator)]).token_ids[0]
                  for _ in range(20)]
    assert sequence_a == sequence_b and len(set(sequence_a)) > 1


def test_logprobs_are_raw_log_softmax_with_top_n_and_the_chosen_token():
    logits = fixed_logits(2, seed=5)
    rows = [SamplingRow(SamplingParams(temperature=0, logprobs=3, repetition_penalty=2.0), [1, 2], 1),
            SamplingRow(SamplingParams(temperature=0), [1], 1)]
    result = Sampler(seed=0)(logits.clone(), rows)
    raw = torch.log_softmax(logits[0].double(), -1)
    top3 = raw.topk(3).indices.tolist()
    chosen = result.token_ids[0]
    assert set(result.logprobs[0]) == set(top3) | {chosen}
    for token, value in result.logprobs[0].items():
        assert value == pytest.approx(raw[token].item(), abs=1e-5)
    assert result.logprobs[1] is None


def test_invalid_params_are_rejected():
    for bad in (dict(top_p=0), dict(temperature=-1), dict(max_tokens=0), dict(min_p=2)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_argmax_rows_equals_torch_argmax():
    """The numpy fast path of greedy choice gives torch's answer: first maximum on ties, first NaN,
    -inf rows, 1-D and 3-D inputs, float64; other dtypes go to torch itself."""
    from toolkit.core.argmax import argmax_rows  # noqa: PLC0415

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 1000, generator=gen)
    logits[1, 10] = logits[1, 900] = 50.0                  # tie: the first wins
    logits[2, 7], logits[2, 300] = float("nan"), float("nan")
    logits[3] = float("-inf")
    logits[4, 999] = float("inf")
    for case in (logits, logits[0], logits.reshape(5, 2, 500), logits.double(), logits[:, ::2],
                 logits.bfloat16(), torch.randint(0, 3, (4, 9))):
        got = argmax_rows(case)
        assert got.dtype == torch.int64 and torch.equal(got, case.argmax(-1)), case.dtype
