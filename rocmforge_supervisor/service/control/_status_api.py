"""Control API routes the status page needs beyond /api/models: devices and live tokens/s.

``GET /api/devices`` re-reads used memory (the same cheap refresh placement does) and says, per
device, how much of it our children hold: what the child's log says it allocated once it is ready,
the placement estimate before that. ``GET /api/throughput`` samples each ready child's token counters
(``/metrics`` and ``/slots``) and divides the tokens generated since the previous sample by the
time between them: a live rate that also counts requests that did not come through the gateway.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ...hardware import Device, Inventory, refresh_usage
from ...supervisor import ChildEndpoint, Supervisor
from ..core._state import state_of
from ..core._visibility import model_scope

__all__ = ["ThroughputSampler", "held_by_models", "routes"]

#: Below this interval a sample returns the previous rate (several open pages share one sampler).
_MIN_INTERVAL = 0.4


def held_by_models(supervisor: Supervisor) -> dict[str, dict[str, int]]:
    """device key → {model: bytes}: the child's own allocation lines once ready, else the estimate."""
    held: dict[str, dict[str, int]] = {}
    for v in supervisor.views():
        for key, n in v.held_bytes.items():
            held.setdefault(key, {})[v.name] = n
    return held


def _device(d: Device, held: dict[str, int]) -> dict[str, Any]:
    extra = d.extra
    return {
        "key": d.key,
        "vendor": d.vendor,
        "name": d.name,
        "usable": d.usable,
        "integrated": d.integrated,
        "skip_reason": d.skip_reason,
        "total_bytes": d.vram_total_bytes,
        "used_bytes": d.vram_used_bytes,
        "free_bytes": d.vram_free_bytes,
        "ours_bytes": sum(held.values()),
        "models": held,
        "gtt_total_bytes": d.gtt_total_bytes,
        "gtt_used_bytes": d.gtt_used_bytes,
        "temperature_c": extra.get("temperature_c"),
        "utilization_pct": extra.get("utilization_pct"),
    }


def devices_json(inventory: Inventory, held: dict[str, dict[str, int]]) -> dict[str, Any]:
    return {
        "devices": [_device(d, held.get(d.key, {})) for d in inventory.devices],
        "notes": list(inventory.notes),
        "kfd": {"present": inventory.kfd.present, "accessible": inventory.kfd.accessible},
    }


@dataclass
class _Sample:
    at: float
    child: int  # the child's pid: a restarted child starts its counters again
    tokens: int  # tokens generated so far: finished requests + those in flight


@dataclass
class ThroughputSampler:
    """Tokens/s per model from successive samples of the child's own counters.

    A sample is ``llamacpp:tokens_predicted_total`` from ``/metrics`` (tokens of finished
    requests) plus ``n_decoded`` of the slots still processing (``/slots``). Neither alone is
    enough: the counter moves only when a request ends, and a slot's ``n_decoded`` reads 0 once it
    is released — a fast model that starts and finishes a request between two samples showed as
    0 tokens/s. ``/metrics`` is read first: a request that ends between the two reads is then
    missing from this sample and counted in the next, never twice.
    """

    client: httpx.AsyncClient
    _last: dict[str, _Sample] = field(default_factory=dict)
    _rate: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def sample(self, supervisor: Supervisor) -> dict[str, dict[str, Any]]:
        views = supervisor.views()
        ready = {v.name: v.child for v in views if v.ready and v.child is not None}
        for gone in set(self._last) - set(ready):
            self._last.pop(gone, None)
            self._rate.pop(gone, None)
        async with anyio.create_task_group() as tg:
            for name, server in ready.items():
                tg.start_soon(self._one, name, server)
        return {v.name: self._rate.get(v.name, {"tokens_per_second": None}) for v in views}

    async def _get(self, child: ChildEndpoint, path: str) -> httpx.Response | None:
        try:
            r = await self.client.get(f"{child.base_url}{path}", headers=child.headers(), timeout=2.0)
        except httpx.HTTPError:
            return None
        return r if r.status_code == 200 else None

    async def _one(self, name: str, server: ChildEndpoint) -> None:
        prev = self._last.get(name)
        now = time.monotonic()
        if prev is not None and now - prev.at < _MIN_INTERVAL:
            return
        metrics = await self._get(server, "/metrics")
        slots = await self._get(server, "/slots")
        try:
            rows = slots.json() if slots is not None else None
        except ValueError:
            rows = None
        if not isinstance(rows, list):  # --no-slots, or the child is going away
            self._rate[name] = {"tokens_per_second": None}
            return
        finished = _predicted_total(metrics.text) if metrics is not None else 0
        busy = [row for row in rows if isinstance(row, dict) and row.get("is_processing")]
        sample = _Sample(now, int(server.pid or 0), finished + sum(_decoded(row) for row in busy))
        self._last[name] = sample
        if prev is None or prev.child != sample.child:
            self._rate[name] = {"tokens_per_second": 0.0 if not busy else None, "busy_slots": len(busy)}
            return
        rate = max(0.0, (sample.tokens - prev.tokens) / (now - prev.at))
        self._rate[name] = {"tokens_per_second": round(rate, 1), "busy_slots": len(busy), "slots": len(rows)}


def _predicted_total(text: str) -> int:
    """``llamacpp:tokens_predicted_total`` from the child's Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total "):
            try:
                return int(float(line.split()[1]))
            except (IndexError, ValueError):
                return 0
    return 0


def _decoded(row: dict[str, Any]) -> int:
    nxt = row.get("next_token")
    if isinstance(nxt, list):
        nxt = nxt[0] if nxt else None
    n = nxt.get("n_decoded") if isinstance(nxt, dict) else None
    return n if isinstance(n, int) and n > 0 else 0


def _sampler(request: Request) -> ThroughputSampler:
    """One per app, made on first use (several open pages share it)."""
    sampler: ThroughputSampler | None = getattr(request.app.state, "throughput", None)
    if sampler is None:
        sampler = request.app.state.throughput = ThroughputSampler(state_of(request).upstream)
    return sampler


async def api_devices(request: Request) -> Response:
    """
    summary: Every device with total / used / free memory and what our children hold on it.
    description: A key scoped to some models sees only theirs among the holders (and in ours_bytes);
      the others' memory counts as used by others.
    responses:
      200: {description: "{devices: [{key, name, usable, skip_reason, total_bytes, used_bytes, free_bytes, ours_bytes, models}], notes}"}
      503: {description: the service is still detecting devices}
    """
    supervisor = state_of(request).supervisor
    if supervisor.inventory is None:
        return JSONResponse({"devices": [], "notes": ["still detecting devices"]}, status_code=503)
    inventory = await anyio.to_thread.run_sync(refresh_usage, supervisor.inventory, supervisor.settings)
    seen = model_scope(request.scope, supervisor)
    held = {
        device: {model: n for model, n in models.items() if seen.sees(model)}
        for device, models in held_by_models(supervisor).items()
    }
    return JSONResponse(devices_json(inventory, held))


async def api_throughput(request: Request) -> Response:
    """
    summary: Live tokens/s per model, from the child's /slots (tokens decoded since the last sample).
    description: A key scoped to some models gets theirs only.
    responses:
      200: {description: "{models: {name: {tokens_per_second, busy_slots, slots, draft_tokens, draft_accepted, draft_acceptance}}}"}
    """
    st = state_of(request)
    rates = await _sampler(request).sample(st.supervisor)  # every model: one sampler for all pages
    seen = model_scope(request.scope, st.supervisor)
    return JSONResponse(
        {
            "models": {
                name: {**r, **st.metrics.drafts.rate(name)} for name, r in rates.items() if seen.sees(name)
            }
        }
    )


def routes() -> list[BaseRoute]:
    return [
        Route("/api/devices", api_devices, methods=["GET"]),
        Route("/api/throughput", api_throughput, methods=["GET"]),
    ]
