"""Throughput and latency of the engine at several batch sizes (used by ``toolkit bench`` and bench/).

For each batch size, that many requests of ``input_len`` random prompt tokens are queued at
once and run to ``output_len`` tokens each (end-of-sequence ignored). Reported: output tokens
per second over the whole batch, time to first token (TTFT) and time per output token after
the first (TPOT), as percentiles over the requests.
"""
from __future__ import annotations

import statistics
import time

import torch

from ..units import format_rate
from .sampling_params import SamplingParams

PERCENTILES = (50, 90, 99)


def percentile(values: list[float], pct: float) -> float:
    """Linear-interpolated percentile (values need not be sorted)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def random_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (count, length), generator=generator).tolist()


def measure(llm, batch_size: int, input_len: int, output_len: int, *, temperature: float = 0.0,
            seed: int = 0, prompts: list[list[int]] | None = None, tokens: list | None = None) -> dict:
    """Run one batch through ``llm``'s step loop and time every token.

    :param prompts: the batch's prompts (default: random ones of ``input_len`` tokens)
    :param tokens: if given, each request's generated token ids are appended to it, in prompt order
    """
    prompts = prompts or random_prompts(batch_size, input_len, llm.config.vocab_size, seed)
    params = SamplingParams(max_tokens=output_len, temperature=temperature, ignore_eos=True, seed=seed)
    start = time.perf_counter()
    ids = [llm.add_request(prompt, params) for prompt in prompts]
    times: dict[str, list[float]] = {request_id: [] for request_id in ids}
    pending, finished = set(ids), {}
    while pending:
        outputs = llm.step()
        now = time.perf_counter()
        for out in outputs:
            if out.request_id in times:
                times[out.request_id].append(now)
                if out.finished:
                    pending.discard(out.request_id)
                    finished[out.request_id] = out.token_ids
    elapsed = time.perf_counter() - start
    if tokens is not None:
        tokens.extend(finished[request_id] for request_id in ids)
    ttft = [t[0] - start for t in times.values()]
    tpot = [(t[-1] - t[0]) / (len(t) - 1) for t in times.values() if len(t) > 1]
    row = {"batch_size": batch_size, "input_len": input_len, "output_len": output_len, "seconds": elapsed,
           "output_tokens_per_s": sum(map(len, times.values())) / elapsed, "mean_tpot_ms": 1e3 * statistics.fmean(tpot or [0])}
    for pct in PERCENTILES:
        row[f"ttft_p{pct}_ms"] = 1e3 * percentile(ttft, pct)
        row[f"tpot_p{pct}_ms"] = 1e3 * percentile(tpot, pct)
    return row


def run(llm, batch_sizes: list[int], input_len: int, output_len: int, *, warmup: bool = True,
        warmup_each: bool = False, temperature: float = 0.0) -> list[dict]:
    """``measure`` at each batch size (after one small warm-up batch that compiles and caches kernels).

    ``warmup_each``: before each size, a short untimed batch of that size and prompt length (4 new tokens),
    so the measured one finds its prefill and mixed-step graphs captured and its kernels compiled: the
    steady state. Without it the first measurement at a new batch size pays those once-per-shape costs
    (on an H100 a 1.5B model's first batch-64 run was 10-25% slower than its second, docs/benchmarks.md)."""
    if warmup:
        measure(llm, min(batch_sizes), min(input_len, 16), min(output_len, 4), temperature=temperature, seed=10**6)
    rows = []
    for i, size in enumerate(batch_sizes):
        if warmup_each:
            measure(llm, size, input_len, min(output_len, 4), temperature=temperature, seed=10**6 + 1 + i)
        rows.append(measure(llm, size, input_len, output_len, temperature=temperature, seed=i))
    return rows


def format_table(rows: list[dict]) -> str:
    columns = [("batch", "batch_size", "{:d}"), ("out tok/s", "output_tokens_per_s", format_rate),
               *((f"TTFT p{p} ms", f"ttft_p{p}_ms", "{:.1f}") for p in PERCENTILES),
               *((f"TPOT p{p} ms", f"tpot_p{p}_ms", "{:.2f}") for p in PERCENTILES)]
    header = [name for name, _, _ in columns]
    body = [[fmt(row[key]) if callable(fmt) else fmt.format(row[key]) for _, key, fmt in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in body]
    return "\n".join(lines)
