"""Load generation against a running ``toolkit serve`` (used by bench/bench_serve_load.py and
tests/test_serve_load.py): start a server process, run rounds of concurrent requests of mixed
lengths (some streamed, some dropped mid-stream), read its /metrics.

Needs httpx (the ``test`` extra).
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

WORDS = ("the capital of France is Paris hello my name is toolkit once upon a time there was a small model "
         "that served many requests at once kalo mine ruza tovi pedo gali mozu reta fibo").split()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``python -m toolkit serve MODEL --port P ...`` in a subprocess, ready once /health answers."""

    def __init__(self, model: str | Path, *args: str, env: dict | None = None, log: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "toolkit", "serve", str(model), "--port", str(self.port),
                   "--log-level", "warning", *args]
        self.log = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 120) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"the server did not answer /health within {timeout} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not subprocess.DEVNULL:
            self.log.close()


def read_metrics(url: str, headers: dict | None = None) -> dict[str, float]:
    """Unlabelled samples of /metrics (name -> value); labelled ones keyed ``name{labels}``."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def wait_idle(url: str, headers: dict | None = None, timeout: float = 30) -> dict[str, float]:
    """Metrics once nothing runs or waits (aborts are applied before the engine's next step)."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = read_metrics(url, headers)
        busy = metrics["toolkit_num_requests_running"] + metrics["toolkit_num_requests_waiting"]
        if busy == 0 or time.monotonic() > deadline:
            return metrics
        time.sleep(0.1)


@dataclass
class RoundResult:
    completed: int = 0
    disconnected: int = 0
    output_tokens: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class RequestSpec:
    prompt: str
    max_tokens: int
    stream: bool
    disconnect_after: int | None  # chunks read before hanging up


def mixed_requests(num_requests: int, num_disconnects: int, seed: int) -> list[RequestSpec]:
    """Prompts of 2-24 words, 1-64 new tokens, half streamed; ``num_disconnects`` 120-token streams dropped early."""
    rng = random.Random(seed)
    dropped = set(rng.sample(range(num_requests), num_disconnects))
    specs = []
    for i in range(num_requests):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.choice((2, 6, 12, 24))))
        if i in dropped:
            specs.append(RequestSpec(prompt, 120, True, rng.randint(1, 4)))
        else:
            specs.append(RequestSpec(prompt, rng.choice((1, 8, 32, 64)), rng.random() < 0.5, None))
    return specs


async def _one(client: httpx.AsyncClient, model: str, spec: RequestSpec, result: RoundResult) -> None:
    body = {"model": model, "prompt": spec.prompt, "max_tokens": spec.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": spec.stream}
    if spec.stream:
        body["stream_options"] = {"include_usage": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.errors.append(f"{response.status_code}: {(await response.aread())[:200]!r}")
                return
            chunks, usage = 0, None
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunks += 1
                usage = json.loads(line[6:]).get("usage") or usage
                if spec.disconnect_after is not None and chunks >= spec.disconnect_after:
                    result.disconnected += 1
                    return  # leaving the block closes the connection mid-stream
        tokens = usage["completion_tokens"] if usage else -1
    else:
        response = await client.post("/v1/completions", json=body)
        if response.status_code != 200:
            result.errors.append(f"{response.status_code}: {response.text[:200]}")
            return
        tokens = response.json()["usage"]["completion_tokens"]
    if tokens != spec.max_tokens:
        result.errors.append(f"expected {spec.max_tokens} tokens, the usage says {tokens}")
        return
    result.completed += 1
    result.output_tokens += tokens


async def run_round(url: str, model: str, specs: list[RequestSpec], concurrency: int,
                    headers: dict | None = None) -> RoundResult:
    """Send ``specs`` with at most ``concurrency`` in flight; count completions, drops and errors."""
    result, semaphore = RoundResult(), asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits, headers=headers) as client:
        async def bounded(spec: RequestSpec) -> None:
            async with semaphore:
                try:
                    await _one(client, model, spec, result)
                except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the round
                    result.errors.append(f"{type(exc).__name__}: {exc}")

        start = time.perf_counter()
        await asyncio.gather(*(bounded(spec) for spec in specs))
        result.seconds = time.perf_counter() - start
    return result


async def throughput(url: str, model: str, concurrency: int, input_len: int, output_len: int, vocab_size: int,
                     num_requests: int, seed: int = 0) -> dict:
    """Output tokens/s of ``num_requests`` streamed greedy requests (``input_len`` random token ids,
    exactly ``output_len`` new tokens each) with ``concurrency`` in flight; TTFT and TPOT percentiles."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab_size) for _ in range(input_len)] for _ in range(num_requests)]
    semaphore, ttft, tpot = asyncio.Semaphore(concurrency), [], []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def one(client: httpx.AsyncClient, prompt: list[int]) -> int:
        body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
                "stream": True}
        async with semaphore:
            start, times = time.perf_counter(), []
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        times.append(time.perf_counter())
        ttft.append(times[0] - start)
        if len(times) > 1:
            tpot.append((times[-1] - times[0]) / (len(times) - 1))
        return len(times)

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        chunks = await asyncio.gather(*(one(client, prompt) for prompt in prompts))
        seconds = time.perf_counter() - start
    return {"concurrency": concurrency, "requests": num_requests, "seconds": seconds,
            "output_tokens_per_s": num_requests * output_len / seconds, "chunks": sum(chunks),
            "ttft_p50_ms": 1e3 * _percentile(ttft, 50), "ttft_p99_ms": 1e3 * _percentile(ttft, 99),
            "tpot_p50_ms": 1e3 * _percentile(tpot, 50), "tpot_p99_ms": 1e3 * _percentile(tpot, 99)}


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values) or [float("nan")]
    return ordered[min(len(ordered) - 1, int(round((len(ordered) - 1) * pct / 100)))]
