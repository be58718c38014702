"""The server's Prometheus metrics, in a registry of its own (several apps in one process, e.g. tests).

Requests by endpoint and outcome, prompt and output tokens, target passes (τ = output tokens / target
passes), drafted and accepted tokens (acceptance), queue depth and running requests, time to first
token, time per output token, and target passes shared by several requests ("batched" rounds) vs
read by one ("sequential").
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServeMetrics"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TAU = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)


class ServeMetrics:
    """Counters, gauges and histograms of one server (``render()``: the text /metrics serves)."""

    def __init__(self, *, batching_mode: str):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("specbound_requests", "requests by endpoint and outcome", ["endpoint", "outcome"],
                                registry=r)
        self.prompt_tokens = Counter("specbound_prompt_tokens", "prompt tokens of decoded requests", registry=r)
        self.output_tokens = Counter("specbound_output_tokens", "tokens generated", registry=r)
        self.target_passes = Counter("specbound_target_passes", "target passes of decoded requests (τ = "
                                     "output tokens / target passes)", registry=r)
        self.drafted = Counter("specbound_drafted_tokens", "drafted tokens tested against the target", registry=r)
        self.accepted = Counter("specbound_accepted_tokens", "drafted tokens accepted", registry=r)
        self.tau = Histogram("specbound_request_tau", "tokens per target pass, per request", buckets=_TAU, registry=r)
        self.queue_depth = Gauge("specbound_queue_depth", "requests waiting to start", registry=r)
        self.running = Gauge("specbound_running_requests", "requests decoding now", registry=r)
        self.ttft = Histogram("specbound_time_to_first_token_seconds", "arrival to the first output token",
                              buckets=_LATENCY, registry=r)
        self.tpot = Histogram("specbound_time_per_output_token_seconds", "after the first token, per output token",
                              buckets=_LATENCY, registry=r)
        self.rounds = Counter("specbound_rounds", "request rounds by whether their target pass was shared by "
                              "several requests (batched) or read one request (sequential)", ["mode"], registry=r)
        self.shared_passes = Counter("specbound_shared_target_passes", "target passes over several requests' rows",
                                     registry=r)
        mode = Gauge("specbound_batching", "1 for the batching this server chose", ["mode"], registry=r)
        mode.labels(mode=batching_mode).set(1)

    def observe_pass(self, record) -> None:
        """One scheduled pass (a PassRecord); only target passes (priority >= 1) are rounds."""
        if record.priority < 1:
            return
        if record.rows > 1:
            self.rounds.labels(mode="batched").inc(record.rows)
            self.shared_passes.inc()
        else:
            self.rounds.labels(mode="sequential").inc()

    def observe_result(self, prompt_tokens: int, metrics) -> None:
        """A finished (or cancelled) request's DecodeMetrics."""
        self.prompt_tokens.inc(prompt_tokens)
        self.output_tokens.inc(metrics.new_tokens)
        self.target_passes.inc(metrics.target_calls)
        self.drafted.inc(sum(metrics.position_reached))
        self.accepted.inc(sum(metrics.position_accepted))
        if metrics.target_calls:
            self.tau.observe(metrics.tau)

    def render(self) -> bytes:
        return generate_latest(self.registry)
