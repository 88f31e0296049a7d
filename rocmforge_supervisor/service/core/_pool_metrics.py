"""The gauges an inference router schedules by: the Gateway API Inference Extension's model-server
protocol (queued requests, running requests, KV-cache utilisation, cache and LoRA info), per model
and summed for the pod, in forge's own names.

An endpoint picker (llm-d-router's ``core-metrics-extractor``) reads one series per spec: the first
that matches its labels. So ``forge_model_*`` have one series per model (``model`` label: a pool per
model filters on it), and ``forge_*`` one series summed over the pod (a pool per group of identical
forge pods). ``deploy/kubernetes/components/inference`` maps the picker's specs to them.

What each counts, and why:

- waiting: requests in forge's queue for the model (over ``max_concurrency``) plus the child's own
  deferred ones (``llamacpp:requests_deferred``): both wait for a slot.
- running: requests forge has at the child (``in_flight``): what the child is computing.
- KV-cache usage, 0–1: llama-server at the pinned commit exports none, so it is computed from
  ``/slots``: the tokens of the requests being processed (prompt + generated) over the context of
  all slots. A finished request's cells stay cached for prompt reuse but are free to be overwritten,
  so they do not count: the fraction falls back when the work is done.
- cache info: llama.cpp's KV cache is per token, so ``block_size`` is 1 and ``num_gpu_blocks`` the
  total context in tokens.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from ...supervisor import ModelStatus

__all__ = ["PoolSample", "pool_families", "sample_model"]

_LORA_FLAGS = ("--lora", "--lora-scaled")


@dataclass(frozen=True)
class PoolSample:
    """One model's load, as the gauges report it."""

    name: str
    waiting: int
    running: int
    kv_tokens: int  # tokens held by the requests being processed
    kv_capacity: int  # the context of all slots, in tokens
    lora_adapters: tuple[str, ...] = field(default=())


def _deferred(child_metrics: str | None) -> int:
    if not child_metrics:
        return 0
    try:
        for fam in text_string_to_metric_families(child_metrics):
            if fam.name in ("llamacpp:requests_deferred", "llamacpp_requests_deferred"):
                return int(sum(s.value for s in fam.samples))
    except ValueError:
        pass
    return 0


def _kv(slots: object) -> tuple[int, int]:
    if not isinstance(slots, Sequence):
        return 0, 0
    used = capacity = 0
    for slot in slots:
        if not isinstance(slot, Mapping):
            continue
        n_ctx = slot.get("n_ctx")
        capacity += n_ctx if isinstance(n_ctx, int) else 0
        if not slot.get("is_processing"):
            continue
        prompt = slot.get("n_prompt_tokens")
        decoded = 0
        nxt = slot.get("next_token")
        if isinstance(nxt, Sequence) and nxt and isinstance(nxt[0], Mapping):
            value = nxt[0].get("n_decoded")
            decoded = value if isinstance(value, int) else 0
        used += (prompt if isinstance(prompt, int) else 0) + decoded
    return min(used, capacity), capacity


def _lora_adapters(args: Sequence[str]) -> tuple[str, ...]:
    names: list[str] = []
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag in _LORA_FLAGS:
            path = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if path:
                names.append(re.sub(r"\.gguf$", "", path.rsplit("/", 1)[-1]))
    return tuple(names)


def sample_model(
    row: ModelStatus,
    child_metrics: str | None,
    slots: object,
    args: Sequence[str] = (),
    adapters: Sequence[str] = (),
) -> PoolSample:
    """One model's sample from its status, its child's ``/metrics`` text and ``/slots``;
    ``adapters``: its ``[adapters.*]`` names (a ``--lora`` in ``args`` is named by its file)."""
    used, capacity = _kv(slots)
    return PoolSample(
        name=row.name,
        waiting=row.waiting + _deferred(child_metrics),
        running=row.in_flight,
        kv_tokens=used,
        kv_capacity=capacity,
        lora_adapters=(*_lora_adapters(args), *adapters),
    )


def pool_families(samples: Sequence[PoolSample]) -> Iterator[Metric]:
    """The gauges: ``forge_model_*`` one series per model, ``forge_*`` one for the pod. Separate
    names, not one family with and without the label: a picker's spec without labels matches any
    series and takes the first, so a pod total must not share a name with per-model series."""
    per_model = {
        "waiting": GaugeMetricFamily(
            "forge_model_requests_waiting",
            "requests waiting for a slot: forge's queue plus the child's deferred",
            labels=["model"],
        ),
        "running": GaugeMetricFamily(
            "forge_model_requests_running", "requests being computed by the model's child", labels=["model"]
        ),
        "kv": GaugeMetricFamily(
            "forge_model_kv_cache_usage_ratio",
            "0-1: tokens of the requests in progress over the context of all the child's slots",
            labels=["model"],
        ),
        "cache": GaugeMetricFamily(
            "forge_model_cache_config_info",
            "KV cache layout: block_size 1 (per-token cells), num_gpu_blocks = context tokens of all slots",
            labels=["model", "block_size", "num_gpu_blocks"],
        ),
    }
    for s in samples:
        per_model["waiting"].add_metric([s.name], float(s.waiting))
        per_model["running"].add_metric([s.name], float(s.running))
        per_model["kv"].add_metric([s.name], s.kv_tokens / s.kv_capacity if s.kv_capacity else 0.0)
        per_model["cache"].add_metric([s.name, "1", str(s.kv_capacity)], 1.0)
    yield from per_model.values()
    capacity = sum(s.kv_capacity for s in samples)
    yield GaugeMetricFamily(
        "forge_requests_waiting",
        "requests waiting for a slot, all models",
        value=float(sum(s.waiting for s in samples)),
    )
    yield GaugeMetricFamily(
        "forge_requests_running",
        "requests being computed, all models",
        value=float(sum(s.running for s in samples)),
    )
    yield GaugeMetricFamily(
        "forge_kv_cache_usage_ratio",
        "0-1: tokens of the requests in progress over the context of all slots, all models",
        value=sum(s.kv_tokens for s in samples) / capacity if capacity else 0.0,
    )
    info = GaugeMetricFamily(
        "forge_cache_config_info", "KV cache layout of all models", labels=["block_size", "num_gpu_blocks"]
    )
    info.add_metric(["1", str(capacity)], 1.0)
    yield info
    lora = GaugeMetricFamily(
        "forge_model_lora_requests_info",
        "LoRA adapters of the model's child (vLLM's lora_requests_info shape; value: scrape time)",
        labels=["model", "running_lora_adapters", "waiting_lora_adapters", "max_lora"],
    )
    now = time.time()
    for s in samples:
        if s.lora_adapters:
            lora.add_metric([s.name, ",".join(s.lora_adapters), "", str(len(s.lora_adapters))], now)
    if lora.samples:
        yield lora
