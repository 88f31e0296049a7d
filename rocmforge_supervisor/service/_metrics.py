"""Prometheus metrics: the gateway's own, the supervisor's state, and each child's, relabelled."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ..supervisor import ModelState, ModelStatus

__all__ = ["Metrics"]

_STATES = tuple(s.value for s in ModelState)


class _SupervisorCollector(Collector):
    def __init__(self, status: Callable[[], list[ModelStatus]], child_texts: dict[str, str]) -> None:
        self._status = status
        self._child_texts = child_texts

    def collect(self) -> Iterable[Metric]:
        rows = self._status()
        state = GaugeMetricFamily(
            "forge_model_state", "1 for the model's current state", labels=["model", "state"]
        )
        restarts = GaugeMetricFamily(
            "forge_model_restarts", "restarts of the model's child", labels=["model"]
        )
        in_flight = GaugeMetricFamily("forge_model_in_flight", "requests at the child", labels=["model"])
        waiting = GaugeMetricFamily("forge_model_waiting", "requests in the model's queue", labels=["model"])
        for r in rows:
            for s in _STATES:
                state.add_metric([r.name, s], 1.0 if r.state == s else 0.0)
            restarts.add_metric([r.name], float(r.restarts))
            in_flight.add_metric([r.name], float(r.in_flight))
            waiting.add_metric([r.name], float(r.waiting))
        yield from (state, restarts, in_flight, waiting)
        yield from self._children()

    def _children(self) -> Iterator[Metric]:
        """llama-server's own metrics (``llamacpp:*``), one series per model label."""
        merged: dict[str, Metric] = {}
        for model, text in list(self._child_texts.items()):
            try:
                families = list(text_string_to_metric_families(text))
            except ValueError:
                continue
            for fam in families:
                out = merged.get(fam.name)
                if out is None:
                    out = Metric(fam.name, fam.documentation, fam.type)
                    merged[fam.name] = out
                for sample in fam.samples:
                    out.add_sample(sample.name, {**sample.labels, "model": model}, sample.value)
        yield from merged.values()


class Metrics:
    def __init__(self, status: Callable[[], list[ModelStatus]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.child_texts: dict[str, str] = {}
        labels = ["model"]
        self.requests = Counter(
            "forge_requests",
            "requests by model, endpoint and status",
            [*labels, "endpoint", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "forge_request_errors", "failed requests by kind", [*labels, "kind"], registry=self.registry
        )
        self.tokens_in = Counter("forge_prompt_tokens", "prompt tokens", labels, registry=self.registry)
        self.tokens_out = Counter(
            "forge_completion_tokens", "completion tokens", labels, registry=self.registry
        )
        self.ttft = Histogram(
            "forge_time_to_first_token_seconds",
            "request received → first byte of the answer",
            labels,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.duration = Histogram(
            "forge_request_duration_seconds",
            "request received → response finished",
            labels,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.load_seconds = Histogram(
            "forge_model_load_seconds",
            "spawn → ready",
            labels,
            buckets=(0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=self.registry,
        )
        self.registry.register(_SupervisorCollector(status, self.child_texts))

    def render(self) -> bytes:
        return generate_latest(self.registry)
