"""``forge serve``, and the commands that talk to a running service: ps, unload, logs, reload."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import typer
from rich.table import Table

from .._errors import ServiceError
from ..settings import get_settings
from ._common import console, err_console

__all__ = ["connect_service", "register"]

_CONFIG_OPT = typer.Option(
    None, "--config", help="The forge.toml (default: XDG config, then /etc/rocmforge)."
)


def _load_config(path: Path | None) -> Any:
    from ..service._config import load_config

    return load_config(path, get_settings())


def connect_service(config_path: Path | None, *, required: bool) -> Any:
    """The running service's client, or None (or an error when ``required``)."""
    from ..service._client import find_service

    settings = get_settings()
    api_key = None
    state_dir = settings.state_dir
    try:
        cfg = _load_config(config_path)
        state_dir = cfg.state_dir
        api_key = cfg.server.api_key.get_secret_value() if cfg.server.api_key else None
    except Exception:  # no config, or a bad one: the service may still be reachable by its file
        if config_path is not None:
            raise
    client = find_service(state_dir, api_key=api_key)
    if client is None and required:
        raise ServiceError(
            "no forge service is running",
            hint="start one with `forge serve --config forge.toml` (or `systemctl start forge`)",
        )
    return client


def serve(
    config: Path | None = _CONFIG_OPT,
    host: str | None = typer.Option(None, "--host", help="Override server.host."),
    port: int | None = typer.Option(
        None, "--port", min=0, max=65535, help="Override server.port (0 = a free one)."
    ),
    log_format: str | None = typer.Option(None, "--log-format", help="text or json."),
    check_config: bool = typer.Option(
        False,
        "--check-config",
        help="Only validate the config (file + FORGE_* variables): exit 0, or 2 and the error.",
    ),
) -> None:
    """Run the supervisor: many models behind one OpenAI-compatible endpoint, until SIGTERM/Ctrl-C."""
    from ..service._config import load_config
    from ..service._logging import setup_logging
    from ..service._sdnotify import SdNotifier
    from ..service._server import run_service

    settings = get_settings()
    cfg = load_config(config, settings)
    overrides = {
        k: v for k, v in {"host": host, "port": port, "log_format": log_format}.items() if v is not None
    }
    if overrides:
        cfg = cfg.with_server(**overrides)
    if check_config:
        err_console.print(f"config OK: {cfg.source or 'defaults'} ({len(cfg.models)} models)", markup=False)
        return
    setup_logging(cfg.server.log_format, settings)
    notifier = SdNotifier.from_settings(settings)
    source = cfg.source

    def reload_config() -> Any:
        new = load_config(source, settings)
        return new.with_server(**overrides) if overrides else new

    def on_listening(url: str) -> None:
        console.print(url)
        names = ", ".join(cfg.models) or "none"
        err_console.print(f"forge serve listening on {url} (OpenAI base URL {url}/v1); models: {names}")
        if cfg.models:
            first = next(iter(cfg.models))
            auth = ' -H "Authorization: Bearer $FORGE_API_KEY"' if cfg.server.api_key else ""
            err_console.print(
                f"try: curl {url}/v1/chat/completions{auth} -H 'Content-Type: application/json' "
                f'-d \'{{"model": "{first}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'',
                markup=False,
            )
            err_console.print(
                f'or:  OpenAI(base_url="{url}/v1", api_key="…").chat.completions.create(model="{first}", …)',
                markup=False,
            )

    from ..service._server import loop_options

    anyio.run(
        lambda: run_service(
            cfg,
            settings,
            config_path=source,
            load_config=reload_config if source is not None else None,
            notifier=notifier,
            on_listening=on_listening,
        ),
        backend_options=loop_options(),
    )


def _fmt_bytes(n: int | None) -> str:
    if not n:
        return "-"
    return f"{n / 2**20:.0f} MiB"


def _devices(row: dict[str, Any]) -> str:
    """Local device keys, or for a model on RPC workers each worker with its share of the layers."""
    workers = row.get("workers") or []
    if workers:
        return ", ".join(f"{w['worker']} {float(w['share']):.0%} ({w['layers']} layers)" for w in workers)
    return ",".join(row.get("devices") or []) or "-"


def ps(
    config: Path | None = _CONFIG_OPT,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The running service's models: state, pid, port, devices, restarts, memory, last error."""
    client = connect_service(config, required=True)
    rows = client.models()
    if as_json:
        console.print_json(json.dumps({"models": rows}))
        return
    t = Table(
        "name", "state", "pid", "port", "devices", "restarts", "memory est/actual", "uptime", "last error"
    )
    for r in rows:
        mem = r.get("memory") or {}
        est = sum((mem.get("estimated_bytes") or {}).values())
        act = sum(
            sum(parts.values()) if isinstance(parts, dict) else int(parts)
            for parts in (mem.get("actual_bytes") or {}).values()
        )
        up = r.get("uptime")
        t.add_row(
            r["name"],
            r["state"],
            str(r.get("pid") or "-"),
            str(r.get("port") or "-"),
            _devices(r),
            str(r.get("restarts", 0)),
            f"{_fmt_bytes(est)} / {_fmt_bytes(act)}",
            f"{up:.0f} s" if up else "-",
            (r.get("last_error") or "")[:60],
        )
    console.print(t)


def unload(name: str = typer.Argument(...), config: Path | None = _CONFIG_OPT) -> None:
    """Drain and stop a model in the running service."""
    client = connect_service(config, required=True)
    status = client.unload(name)
    err_console.print(f"{name}: {status['state']}")


def reload(config: Path | None = _CONFIG_OPT) -> None:
    """Ask the running service to re-read its config (same as SIGHUP)."""
    client = connect_service(config, required=True)
    console.print_json(json.dumps(client.reload()))


def logs(
    name: str = typer.Argument(...),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines."),
    tail: int = typer.Option(200, "--tail", "-n", min=0),
    config: Path | None = _CONFIG_OPT,
) -> None:
    """A model's llama-server log from the running service."""
    client = connect_service(config, required=True)
    try:
        for line in client.logs(name, tail=tail, follow=follow):
            console.print(line, markup=False, highlight=False)
    except KeyboardInterrupt:
        return


def load_via_service(model: str, config: Path | None) -> bool:
    """``forge load NAME`` with a service running: load it there. False when no service answers
    (or it does not know the name), so the caller falls back to the foreground mode."""
    client = connect_service(config, required=False)
    if client is None:
        return False
    names = {r["name"] for r in client.models()}
    if model not in names:
        return False
    t0 = time.monotonic()
    with err_console.status(f"loading {model} in the forge service at {client.base_url} …") as spinner:
        # Progress from the same event stream the control API serves: state changes as they come.
        from ..service._client import ServiceClient

        watcher = ServiceClient(client.base_url, client.api_key)

        def follow() -> None:
            try:
                for ev in watcher.events():
                    if ev.get("model") == model:
                        spinner.update(
                            f"{model}: {ev.get('kind')} {ev.get('state') or ''} {ev.get('data') or ''}"
                        )
            except Exception:  # noqa: S110 — progress display only; closed under us when the load returns
                pass

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        try:
            status = client.load(model)
        finally:
            watcher.close()
    err_console.print(
        f"{model}: {status['state']} (pid {status.get('pid')}, devices {','.join(status.get('devices') or [])}) "
        f"in {time.monotonic() - t0:.1f} s — OpenAI base URL {client.base_url}/v1"
    )
    return True


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("ps")(ps)
    app.command("unload")(unload)
    app.command("logs")(logs)
    app.command("reload")(reload)
