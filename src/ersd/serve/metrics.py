"""Prometheus metrics of the server, with vLLM's names where one exists (``vllm:...``) so
existing dashboards work; ERSD-only series are ``ersd:...``.  Each app has its own registry."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ersd.results import StepRecord

__all__ = ["CONTENT_TYPE", "Metrics"]

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, [*labels, *extra], registry=r)

        self.running = Gauge(
            "vllm:num_requests_running", "Sequences in the running batch.", labels, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Sequences waiting for a batch row.", labels, registry=r
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.success = counter(
            "vllm:request_success", "Requests finished, by finish reason.", ["finished_reason"]
        )
        self.drafts = counter(
            "vllm:spec_decode_num_drafts", "Target calls that verified a draft tree."
        )
        self.draft_tokens = counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens proposed (tree nodes)."
        )
        self.accepted_tokens = counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted."
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Request latency, arrival to last token.",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to the first generated token.",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.steps = counter("ersd:engine_steps", "Engine steps (one shared target call each).")
        self.rejected = counter(
            "ersd:requests_rejected", "Requests refused (queue full, shutting down).", ["reason"]
        )
        self.errors = counter("ersd:request_errors", "Requests that ended with a server error.")
        self.invalid = counter(
            "ersd:requests_invalid",
            "Requests refused as invalid (HTTP 4xx: bad fields or text, no API key, too large).",
            ["status"],
        )
        self.cancelled = counter(
            "ersd:requests_cancelled",
            "Requests whose client left before they finished (their rows were freed).",
        )
        self.detections = counter(
            "ersd:watermark_detections",
            "Texts scored by /v1/watermark/detect, by verdict (watermarked true/false).",
            ["watermarked"],
        )
        self.model_name = model_name
        # every series labelled by the model alone exists from the start, at 0 (as vLLM's): a
        # scrape before the first request sees the counters, and rate() has a starting point
        for metric in (
            self.running,
            self.waiting,
            self.prompt_tokens,
            self.generation_tokens,
            self.drafts,
            self.draft_tokens,
            self.accepted_tokens,
            self.e2e,
            self.ttft,
            self.steps,
            self.errors,
            self.cancelled,
        ):
            metric.labels(model_name)

    def on_step(self, records: Sequence[StepRecord], seconds: float) -> None:
        """Engine-thread hook: one step's records."""
        m = self.model_name
        self.steps.labels(m).inc()
        self.generation_tokens.labels(m).inc(sum(len(r.tokens) for r in records))
        drafted = [r for r in records if r.num_draft_tokens]
        if drafted:
            self.drafts.labels(m).inc(len(drafted))
            self.draft_tokens.labels(m).inc(sum(r.num_draft_tokens for r in drafted))
            self.accepted_tokens.labels(m).inc(sum(r.num_accepted for r in drafted))

    def set_queue(self, running: int, waiting: int) -> None:
        self.running.labels(self.model_name).set(running)
        self.waiting.labels(self.model_name).set(waiting)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
