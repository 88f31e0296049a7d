"""Prometheus metrics: the gateway's own, the supervisor's state, and each child's, relabelled.

The names are listed in the README ("Metrics"). Load times are observed from the supervisor's
event history at scrape time (each ``ready`` event once, by its sequence number), so the
supervisor needs no hook for them; device memory is re-read at scrape time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ...supervisor import ModelState, ModelStatus
from ._drafting import DraftTally
from ._pool_metrics import PoolSample, pool_families

__all__ = ["DeviceRow", "Metrics"]

#: (device key, name, total bytes, used bytes) of one device, read at scrape time.
DeviceRow = tuple[str, str, int, int]


class _SupervisorCollector(Collector):
    def __init__(self, status: Callable[[], list[ModelStatus]], child_texts: dict[str, str]) -> None:
        self._status = status
        self._child_texts = child_texts
        self.devices: list[DeviceRow] = []
        self.pool: list[PoolSample] = []

    def collect(self) -> Iterable[Metric]:
        rows = self._status()
        state = GaugeMetricFamily(
            "forge_model_state", "1 for the model's current state", labels=["model", "state"]
        )
        restarts = GaugeMetricFamily(
            "forge_model_restarts", "restarts of the model's child", labels=["model"]
        )
        stalls = GaugeMetricFamily(
            "forge_model_stalls", "children killed busy without progress (stall_timeout)", labels=["model"]
        )
        pressure = GaugeMetricFamily(
            "forge_model_pressure_evictions",
            "unloads to yield device memory to other programs (vram_reserve)",
            labels=["model"],
        )
        in_flight = GaugeMetricFamily("forge_model_in_flight", "requests at the child", labels=["model"])
        waiting = GaugeMetricFamily("forge_model_waiting", "requests in the model's queue", labels=["model"])
        for r in rows:
            for s in ModelState:
                state.add_metric([r.name, s.value], 1.0 if r.state == s else 0.0)
            restarts.add_metric([r.name], float(r.restarts))
            stalls.add_metric([r.name], float(r.stalls))
            pressure.add_metric([r.name], float(r.pressure_evictions))
            in_flight.add_metric([r.name], float(r.in_flight))
            waiting.add_metric([r.name], float(r.waiting))
        yield from (state, restarts, stalls, pressure, in_flight, waiting)
        yield from _queues(rows)
        yield from _contexts(rows)
        yield from self._memory(rows)
        yield from pool_families(self.pool)
        yield from self._children()

    def _memory(self, rows: list[ModelStatus]) -> Iterator[Metric]:
        """Per-model memory (forge's estimate and what the child reported allocating, per device;
        the child's RSS) and per-device totals."""
        model_mem = GaugeMetricFamily(
            "forge_model_memory_bytes",
            "memory of the model's child per device: kind=estimated (placement) or actual (its log)",
            labels=["model", "device", "kind"],
        )
        rss = GaugeMetricFamily(
            "forge_model_rss_bytes", "resident memory of the model's child", labels=["model"]
        )
        for r in rows:
            for kind, by_device in (("estimated", r.estimated_bytes), ("actual", r.actual_bytes)):
                for device, value in by_device.items():
                    model_mem.add_metric([r.name, str(device), kind], float(value))
            if r.pid:
                with contextlib.suppress(psutil.Error):
                    rss.add_metric([r.name], float(psutil.Process(r.pid).memory_info().rss))
        total = GaugeMetricFamily(
            "forge_device_memory_total_bytes", "device memory (VRAM; RAM for cpu)", labels=["device", "name"]
        )
        used = GaugeMetricFamily(
            "forge_device_memory_used_bytes", "device memory in use, by anyone", labels=["device", "name"]
        )
        for key, name, total_bytes, used_bytes in self.devices:
            total.add_metric([key, name], float(total_bytes))
            used.add_metric([key, name], float(used_bytes))
        yield from (model_mem, rss, total, used)

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


#: keep_context: (metric, help, key in the status row's ``contexts``). Totals since the service
#: started are counters; what is on disk now is a gauge.
_CONTEXT_COUNTERS = (
    ("forge_context_saves", "KV-cache slots saved at planned stops", "saves"),
    ("forge_context_restores", "saved KV-cache slots restored into a new child", "restores"),
    ("forge_context_saved_bytes", "bytes of KV-cache slots saved", "saved_bytes"),
    ("forge_context_restored_bytes", "bytes of KV-cache slots restored", "restored_bytes"),
    ("forge_context_restore_seconds", "seconds spent restoring KV-cache slots", "restore_seconds"),
    ("forge_context_deleted", "saved slots deleted (mismatch, budget, forget, unusable)", "deleted"),
    ("forge_context_warnings", "saves or restores that failed or were dropped", "warnings"),
    ("forge_conversation_hits", "returning chat turns answered from their saved state", "conversation_hits"),
    ("forge_conversation_misses", "returning chat turns computed, no state used", "conversation_misses"),
    ("forge_conversation_restores", "conversation states restored from disk", "conversation_restores"),
    ("forge_conversation_saves", "conversation states saved after a long turn", "conversation_saves"),
    ("forge_conversation_saved_bytes", "bytes of conversation states saved", "conversation_saved_bytes"),
    (
        "forge_conversation_prefill_saved",
        "prompt tokens restored, not computed",
        "conversation_prefill_saved",
    ),
)
_CONTEXT_GAUGES = (
    ("forge_context_stored", "saved KV-cache slots on disk", "count"),
    ("forge_context_stored_tokens", "tokens in the saved KV-cache slots on disk", "tokens"),
    ("forge_context_stored_bytes", "bytes of the saved KV-cache slots on disk", "bytes"),
    (
        "forge_conversation_states",
        "conversation states on disk (of forge_context_stored)",
        "conversation_states",
    ),
    (
        "forge_conversation_state_bytes",
        "bytes of the conversation states on disk",
        "conversation_state_bytes",
    ),
)


def _contexts(rows: list[ModelStatus]) -> Iterator[Metric]:
    for name, help_, key in _CONTEXT_COUNTERS:
        counter = CounterMetricFamily(name, help_, labels=["model"])
        for r in rows:
            counter.add_metric([r.name], float(r.contexts.get(key, 0)))
        yield counter
    for name, help_, key in _CONTEXT_GAUGES:
        gauge = GaugeMetricFamily(name, help_, labels=["model"])
        for r in rows:
            gauge.add_metric([r.name], float(r.contexts.get(key, 0)))
        yield gauge


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
        self.served_names = Counter(
            "forge_served_name_requests",
            "requests to a variant or adapter name (X:Y) by that name, the model serving it and status",
            ["name", "model", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "forge_request_errors", "failed requests by kind", [*labels, "kind"], registry=self.registry
        )
        self.tokens_in = Counter("forge_prompt_tokens", "prompt tokens", labels, registry=self.registry)
        self.tokens_out = Counter(
            "forge_completion_tokens", "completion tokens", labels, registry=self.registry
        )
        self.key_requests = Counter(
            "forge_key_requests",
            "requests by API key name, model and status",
            ["key", "model", "status"],
            registry=self.registry,
        )
        self.key_tokens = Counter(
            "forge_key_tokens",
            "tokens by API key name, model and kind (prompt, completion)",
            ["key", "model", "kind"],
            registry=self.registry,
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
        self.queue_wait = Histogram(
            "forge_request_queue_seconds",
            "request received → a slot at the child (waiting for the queue and for a load)",
            labels,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.generation = Histogram(
            "forge_request_generation_seconds",
            "a slot at the child → response finished (the child's own work)",
            labels,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.drafts = DraftTally(self.registry)
        self._last_load_seq = 0
        self._collector = _SupervisorCollector(status, self.child_texts)
        self.registry.register(self._collector)
        ProcessCollector(
            registry=self.registry
        )  # process_resident_memory_bytes, process_cpu_seconds_total, …

    def observe_loads(self, history: Iterable[Any]) -> None:
        """Each ``ready`` event's ``load_seconds`` once (events carry a sequence number)."""
        for ev in history:
            if ev.seq <= self._last_load_seq:
                continue
            self._last_load_seq = ev.seq
            seconds = (
                ev.data.get("load_seconds") if ev.kind == "state" and ev.state == ModelState.READY else None
            )
            if isinstance(seconds, (int, float)):
                self.load_seconds.labels(ev.model).observe(float(seconds))

    def set_devices(self, devices: list[DeviceRow]) -> None:
        self._collector.devices = devices

    def set_pool(self, samples: list[PoolSample]) -> None:
        """The inference-routing gauges' inputs, read at scrape time (see ``_pool_metrics``)."""
        self._collector.pool = samples

    def render(self, *, only_key: str | None = None, sees: Callable[[str], bool] | None = None) -> bytes:
        """The exposition text. ``only_key``: of the per-key families (``forge_key_*``), only that
        key's series — what a key that is not an admin may see, as in the activity API (its own
        rows, its own usage); ``""``: none of them (an anonymous caller of a keyed service).
        ``sees``: only the series of the models it accepts (a key scoped to some models learns
        nothing of the others); the pod-wide sums stay, they name no model."""
        if only_key is None and sees is None:
            return generate_latest(self.registry)
        return generate_latest(_AsSeen(self.registry, only_key, sees))


#: The families labelled by API key name (their ``Metric.name``: without ``_total``).
_KEY_FAMILIES = frozenset({"forge_key_requests", "forge_key_tokens"})
#: The families whose ``name`` label is a served model name (``X:Y``), not a device's.
_SERVED_NAME_FAMILIES = frozenset({"forge_served_name_requests"})


class _AsSeen(Collector):
    """The registry as one caller sees it: the per-key families cut to its key's series, and
    every model-labelled series cut to the models it may see."""

    def __init__(
        self, registry: CollectorRegistry, key: str | None, sees: Callable[[str], bool] | None
    ) -> None:
        self._registry = registry
        self._key = key
        self._sees = sees

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():  # fresh objects on each collect: ours to trim
            if self._key is not None and metric.name in _KEY_FAMILIES:
                metric.samples = [s for s in metric.samples if s.labels.get("key") == self._key]
            if self._sees is not None:
                metric.samples = [s for s in metric.samples if self._shown(metric.name, s.labels)]
            yield metric

    def _shown(self, family: str, labels: dict[str, str]) -> bool:
        assert self._sees is not None
        model = labels.get("model")
        if model is not None and not self._sees(model):
            return False
        name = labels.get("name") if family in _SERVED_NAME_FAMILIES else None
        return name is None or self._sees(name)


def _queues(rows: list[ModelStatus]) -> Iterator[Metric]:
    """The admission queue per class (waiting and in flight) and per key (waiting)."""
    waiting = GaugeMetricFamily(
        "forge_model_waiting_class",
        "requests in the model's queue, per priority class",
        labels=["model", "class"],
    )
    in_flight = GaugeMetricFamily(
        "forge_model_in_flight_class", "requests at the child, per priority class", labels=["model", "class"]
    )
    by_key = GaugeMetricFamily(
        "forge_model_waiting_key", "requests in the model's queue, per API key name", labels=["model", "key"]
    )
    for r in rows:
        q = r.queue
        for cls, n in q.get("waiting", {}).items():
            waiting.add_metric([r.name, cls], float(n))
        for cls, n in q.get("in_flight", {}).items():
            in_flight.add_metric([r.name, cls], float(n))
        for key, n in q.get("waiting_by_key", {}).items():
            by_key.add_metric([r.name, key], float(n))
    yield from (waiting, in_flight, by_key)
