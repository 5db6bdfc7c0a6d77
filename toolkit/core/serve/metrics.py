"""Prometheus metrics of the server, every name prefixed ``toolkit_`` (docs/serve.md explains each).

Counters and histograms are updated by the engine thread as tokens come out (``EngineLoop``'s
observer calls); gauges are read at scrape time from the engine loop's stats snapshot, so a
scrape never touches the engine itself. Each server gets its own registry (several apps in
one process, as in tests, do not collide), with the process collector for memory and CPU.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily

# seconds; first-token latency spans prefill on a busy CPU to a cached prefix on a GPU
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)

# stats key -> (metric name, help); state slots appear only when the engine has a state pool
GAUGES = {
    "num_running": ("toolkit_num_requests_running", "Requests holding KV blocks and stepping now."),
    "num_waiting": ("toolkit_num_requests_waiting", "Requests queued for admission (includes preempted ones)."),
    "kv_blocks_used": ("toolkit_kv_cache_blocks_used", "KV-cache blocks held by requests."),
    "kv_blocks_total": ("toolkit_kv_cache_blocks_total", "KV-cache blocks in the pool."),
    "state_slots_used": ("toolkit_state_slots_used", "Recurrent-state slots held by requests (hybrid models)."),
    "state_slots_total": ("toolkit_state_slots_total", "Recurrent-state slots in the pool (hybrid models)."),
    "num_tracked": ("toolkit_server_requests_in_flight", "Engine requests the server is tracking for a client."),
    "prefix_cache_hit_rate": ("toolkit_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache, "
                              "as a fraction of those looked up, since start."),
}


# (used key, total key, metric name, what is counted)
RATIOS = (("kv_blocks_used", "kv_blocks_total", "toolkit_kv_cache_usage_ratio", "KV blocks"),
          ("state_slots_used", "state_slots_total", "toolkit_state_slot_usage_ratio", "recurrent-state slots"))


class _StatsCollector:
    """Gauges from the engine loop's last stats snapshot (and usage ratios derived from them)."""

    def __init__(self, engine_loop):
        self.engine_loop = engine_loop

    def collect(self):
        stats = dict(self.engine_loop.stats)
        stats["num_waiting"] = self.engine_loop.num_waiting
        for key, (name, documentation) in GAUGES.items():
            if key in stats:
                yield GaugeMetricFamily(name, documentation, value=stats[key])
        for used, total, name, what in RATIOS:
            if stats.get(total):
                yield GaugeMetricFamily(name, f"Fraction of {what} in use.", value=stats[used] / stats[total])


class ServerMetrics:
    """The registry and the engine-loop observer calls that update it."""

    def __init__(self):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.prompt_tokens = Counter("toolkit_prompt_tokens", "Prompt tokens of admitted requests.",
                                     registry=self.registry)
        self.generation_tokens = Counter("toolkit_generation_tokens", "Tokens generated.", registry=self.registry)
        self.finished = Counter("toolkit_request_finished", "Engine requests finished, by reason "
                                "(stop, length, abort: client gone or cancelled).", ["finish_reason"],
                                registry=self.registry)
        self.rejected = Counter("toolkit_request_rejected", "HTTP requests answered with an error, by status.",
                                ["status"], registry=self.registry)
        self.ttft = Histogram("toolkit_time_to_first_token_seconds", "From arrival to the first generated token.",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("toolkit_inter_token_latency_seconds", "Between consecutive tokens of one request.",
                             buckets=ITL_BUCKETS, registry=self.registry)
        self.e2e = Histogram("toolkit_e2e_request_latency_seconds", "From arrival to the last token.",
                             buckets=E2E_BUCKETS, registry=self.registry)

    def watch(self, engine_loop) -> None:
        """Expose the engine loop's gauges."""
        self.registry.register(_StatsCollector(engine_loop))

    # ---- observer calls (engine thread) -------------------------------------------------------
    def on_prompt(self, num_tokens: int) -> None:
        self.prompt_tokens.inc(num_tokens)

    def on_first_token(self, seconds: float) -> None:
        self.generation_tokens.inc()
        self.ttft.observe(seconds)

    def on_token(self, seconds: float) -> None:
        self.generation_tokens.inc()
        self.itl.observe(seconds)

    def on_finish(self, finish_reason: str, seconds: float | None) -> None:
        self.finished.labels(finish_reason=finish_reason).inc()
        if seconds is not None:
            self.e2e.observe(seconds)

    def on_error(self, status: int) -> None:
        self.rejected.labels(status=str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
