"""From request fields to the engine's SamplingParams, and the small pieces both routes answer with."""
from __future__ import annotations

from ..engine.sampling_params import SamplingParams
from .engine_loop import Delta
from .errors import ApiError
from .protocol import SamplingFields


def sampling_params(body: SamplingFields, choice: int, *, logprobs: int | None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    """The engine's params for choice ``choice`` of a request (``max_tokens`` is resolved later,
    once the prompt's length is known). A seeded request's choices use seeds ``seed``, ``seed+1``...
    so they differ from each other yet repeat across calls."""
    seed = None if body.seed is None else body.seed + choice
    try:
        return SamplingParams(
            max_tokens=1, temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p, top_k=max(body.top_k or 0, 0), min_p=body.min_p,
            repetition_penalty=body.repetition_penalty, presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty, seed=seed, stop=body.stop_list,
            stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos, logprobs=logprobs,
            skip_special_tokens=body.skip_special_tokens, prompt_logprobs=prompt_logprobs)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc


def finish_reason(delta: Delta, scores_only: bool = False) -> str:
    """OpenAI's finish reason: ``stop`` (a stop token or string) or ``length``."""
    if scores_only:
        return "length"
    return "stop" if delta.finish_reason == "stop" else "length"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
