"""``forge activity`` and ``forge usage``: the running service's request log and per-key sums."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from ._common import console

__all__ = ["register"]

_CONFIG_OPT = typer.Option(
    None, "--config", help="The forge.toml (default: XDG config, then /etc/rocmforge)."
)
_COLUMNS = ("id", "time", "route", "model", "key", "status", "tokens", "ttft", "duration", "finish")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _cells(r: dict[str, Any]) -> list[str]:
    status = str(r["status"]) + (" (cancelled)" if r.get("cancelled") else "")
    if r.get("error"):
        status += f" {r['error']}"
    tokens = "-"
    if r.get("prompt_tokens") is not None or r.get("completion_tokens") is not None:
        tokens = f"{r.get('prompt_tokens') or 0}→{r.get('completion_tokens') or 0}"
    return [
        str(r["id"]),
        datetime.fromtimestamp(r["started"]).strftime("%H:%M:%S"),
        f"{r['route']}" + (" (stream)" if r.get("stream") else ""),
        r.get("model") or "-",
        r.get("key") or "-",
        status,
        tokens,
        _ms(r.get("ttft")),
        _ms(r.get("duration")),
        r.get("finish_reason") or "-",
    ]


def _table(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table  # start-up time: commands import what they use

    t = Table(*_COLUMNS)
    for r in rows:
        t.add_row(*(escape(c) for c in _cells(r)))
    console.print(t)


def activity(
    model: str | None = typer.Option(None, "--model", help="Only this model's requests."),
    key: str | None = typer.Option(None, "--key", help="Only this API key name's requests."),
    status: int | None = typer.Option(None, "--status", help="Only this HTTP status."),
    limit: int = typer.Option(50, "--limit", "-n", min=1, max=10000),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new requests."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (JSON lines with --follow)."),
    url: str | None = typer.Option(None, "--url", help="The service's URL (default: the local one)."),
    config: Path | None = _CONFIG_OPT,
) -> None:
    """The running service's request log: one row per request, newest last."""
    from ._serve import connect_service

    client = connect_service(config, required=True, url=url)
    filters: dict[str, Any] = {"model": model, "key": key, "status": status}
    rows = list(reversed(client.activity(**filters, limit=limit)))
    if as_json and not follow:
        console.print_json(json.dumps({"activity": rows}))
        return
    if as_json:
        for r in rows:
            print(json.dumps(r), flush=True)
    else:
        _table(rows)
    if not follow:
        return
    last = max((r["id"] for r in rows), default=0)
    try:
        while True:
            time.sleep(1.0)
            new = list(reversed(client.activity(**filters, limit=1000, after=last)))
            for r in new:
                last = max(last, r["id"])
                if as_json:
                    print(json.dumps(r), flush=True)
                else:
                    console.print("  ".join(escape(c) for c in _cells(r)))
    except KeyboardInterrupt:
        return


def usage(
    by: str = typer.Option("key", "--by", help="Group by API key name (key) or model (model)."),
    since: str = typer.Option("24h", "--since", help="24h, 7d, 30m, an ISO date, or Unix seconds."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    url: str | None = typer.Option(None, "--url", help="The service's URL (default: the local one)."),
    config: Path | None = _CONFIG_OPT,
) -> None:
    """Requests and tokens per API key name (or per model) from the service's activity log."""
    from ._serve import connect_service

    if by not in ("key", "model"):
        raise typer.BadParameter(f"{by!r} is not key or model", param_hint="--by")
    client = connect_service(config, required=True, url=url)
    out = client.usage(by, since)
    if as_json:
        console.print_json(json.dumps(out))
        return
    from rich.table import Table

    t = Table(by, "requests", "errors", "prompt tokens", "completion tokens", "total tokens")
    for r in out["usage"]:
        t.add_row(
            escape(str(r[by] or "-")),
            *(
                str(r[c] or 0)
                for c in ("requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens")
            ),
        )
    console.print(t)


def register(app: typer.Typer) -> None:
    app.command("activity")(activity)
    app.command("usage")(usage)
