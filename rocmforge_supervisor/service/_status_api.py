"""Control API routes the status page needs beyond /api/models: devices and live tokens/s.

``GET /api/devices`` re-reads used memory (the same cheap refresh placement does) and says, per
device, how much of it our children hold: what the child's log says it allocated once it is ready,
the placement estimate before that. ``GET /api/throughput`` samples each ready child's ``/slots``
(``n_decoded`` per slot) and divides the tokens decoded since the previous sample by the time
between them: a live rate that also counts requests that did not come through the gateway.
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

from ..hardware import Device, Inventory, refresh_usage
from ..supervisor import Supervisor
from ._state import state_of

__all__ = ["ThroughputSampler", "held_by_models", "routes"]

#: Below this interval a sample returns the previous rate (several open pages share one sampler).
_MIN_INTERVAL = 0.4


def held_by_models(supervisor: Supervisor) -> dict[str, dict[str, int]]:
    """device key → {model: bytes}: the child's own allocation lines once ready, else the estimate."""
    held: dict[str, dict[str, int]] = {}
    for m in supervisor.models.values():
        prepared = m.plan
        if prepared is None or not m.running:
            continue
        by_device = dict(prepared.estimated_bytes)
        if m.state == "ready" and prepared.actual:
            by_device.update(prepared.actual.device_totals())
        for key, n in by_device.items():
            if n > 0:
                held.setdefault(key, {})[m.name] = int(n)
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
    slots: dict[int, tuple[int, int]]  # slot id → (task id, tokens decoded)


@dataclass
class ThroughputSampler:
    """Tokens/s per model from successive ``/slots`` samples."""

    client: httpx.AsyncClient
    _last: dict[str, _Sample] = field(default_factory=dict)
    _rate: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def sample(self, supervisor: Supervisor) -> dict[str, dict[str, Any]]:
        ready = {
            m.name: m.server
            for m in supervisor.models.values()
            if m.state == "ready" and m.server is not None and m.server.alive
        }
        for gone in set(self._last) - set(ready):
            self._last.pop(gone, None)
            self._rate.pop(gone, None)
        async with anyio.create_task_group() as tg:
            for name, server in ready.items():
                tg.start_soon(self._one, name, server)
        return {name: self._rate.get(name, {"tokens_per_second": None}) for name in supervisor.models}

    async def _one(self, name: str, server: Any) -> None:
        prev = self._last.get(name)
        now = time.monotonic()
        if prev is not None and now - prev.at < _MIN_INTERVAL:
            return
        try:
            r = await self.client.get(
                f"{server.base_url}/slots",
                headers={"Authorization": f"Bearer {server.api_key}"},
                timeout=2.0,
            )
            rows = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            rows = None
        if not isinstance(rows, list):  # --no-slots, or the child is going away
            self._rate[name] = {"tokens_per_second": None}
            return
        slots = _parse_slots(rows)
        busy = sum(1 for row in rows if isinstance(row, dict) and row.get("is_processing"))
        self._last[name] = _Sample(now, slots)
        if prev is None:
            self._rate[name] = {"tokens_per_second": 0.0 if busy == 0 else None, "busy_slots": busy}
            return
        decoded = 0
        for sid, (task, n) in slots.items():
            before = prev.slots.get(sid)
            decoded += n - before[1] if before is not None and before[0] == task else n
        rate = max(0.0, decoded / (now - prev.at))
        self._rate[name] = {"tokens_per_second": round(rate, 1), "busy_slots": busy, "slots": len(rows)}


def _parse_slots(rows: list[Any]) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("id"), int):
            continue
        nxt = row.get("next_token")
        if isinstance(nxt, list):
            nxt = nxt[0] if nxt else None
        n = nxt.get("n_decoded") if isinstance(nxt, dict) else None
        task = row.get("id_task")
        if isinstance(n, int) and isinstance(task, int):
            out[row["id"]] = (task, n)
    return out


def _sampler(request: Request) -> ThroughputSampler:
    """One per app, made on first use (several open pages share it)."""
    sampler: ThroughputSampler | None = getattr(request.app.state, "throughput", None)
    if sampler is None:
        sampler = request.app.state.throughput = ThroughputSampler(state_of(request).upstream)
    return sampler


async def api_devices(request: Request) -> Response:
    """
    summary: Every device with total / used / free memory and what our children hold on it.
    responses:
      200: {description: "{devices: [{key, name, usable, skip_reason, total_bytes, used_bytes, free_bytes, ours_bytes, models}], notes}"}
      503: {description: the service is still detecting devices}
    """
    supervisor = state_of(request).supervisor
    if supervisor.inventory is None:
        return JSONResponse({"devices": [], "notes": ["still detecting devices"]}, status_code=503)
    inventory = await anyio.to_thread.run_sync(refresh_usage, supervisor.inventory, supervisor.settings)
    return JSONResponse(devices_json(inventory, held_by_models(supervisor)))


async def api_throughput(request: Request) -> Response:
    """
    summary: Live tokens/s per model, from the child's /slots (tokens decoded since the last sample).
    responses:
      200: {description: "{models: {name: {tokens_per_second, busy_slots, slots}}}"}
    """
    return JSONResponse({"models": await _sampler(request).sample(state_of(request).supervisor)})


def routes() -> list[BaseRoute]:
    return [
        Route("/api/devices", api_devices, methods=["GET"]),
        Route("/api/throughput", api_throughput, methods=["GET"]),
    ]
