"""``forge serve``, and the commands that talk to a running service: ps, unload, logs, reload."""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from .._errors import ServiceError, UsageError
from .._units import format_bytes
from ._adapter_check import check_adapters
from ._common import console, err_console, get_settings
from ._draft_check import check_drafts
from ._path_check import check_model_names, missing_model_files

__all__ = [
    "connect_service",
    "load_in_service",
    "load_via_service",
    "register",
    "service_serving",
    "usage_examples",
]

_CONFIG_OPT = typer.Option(
    None, "--config", help="The forge.toml (default: XDG config, then /etc/rocmforge)."
)


def _load_config(path: Path | None) -> Any:
    from ..config import load_config

    return load_config(path, get_settings())


def connect_service(
    config_path: Path | None, *, required: bool, url: str | None = None, api_key: str | None = None
) -> Any:
    """The running service's client, or None (or an error when ``required`` or ``url`` is given).

    Found by ``url`` when given, else by the ``service.json`` the service writes in its state dir.
    The key is ``api_key``, else the config's ``server.api_key`` (which FORGE_API_KEY also sets).
    An ``https://`` service's certificate is checked as ``find_service`` says.
    """
    from ..service import find_service  # not the server, nor httpx without a service running

    settings = get_settings()
    state_dir = settings.state_dir
    tls_cert = None
    try:
        cfg = _load_config(config_path)
        state_dir = cfg.state_dir
        tls_cert = cfg.server.tls_cert
        if api_key is None and cfg.server.api_key:
            api_key = cfg.server.api_key.get_secret_value()
    except Exception:  # no config, or a bad one: the service may still be reachable by its file
        if config_path is not None:
            raise
    if url is not None and not url.startswith(("http://", "https://")):
        raise UsageError(f"--url {url!r} is not an http(s) URL", hint="e.g. --url http://127.0.0.1:8080")
    client = find_service(
        state_dir,
        url=url.removesuffix("/").removesuffix("/v1") if url else None,
        api_key=api_key,
        tls_cert=tls_cert,
    )
    if client is None and url is not None:
        raise ServiceError(
            f"no forge service answers at {url}",
            hint="check the URL (and that `forge serve` runs there), or leave --url out",
        )
    if client is None and required:
        raise ServiceError(
            "no forge service is running",
            hint="start one with `forge serve --config forge.toml` (or `systemctl start forge`)",
        )
    return client


def usage_examples(url: str, model: str, *, keyed: bool, cacert: Path | None = None) -> list[str]:
    """What ``forge serve`` prints to try it: a curl and a Python program, both complete enough to
    paste into a shell as they are (ASCII only, a key that works, a ``max_tokens``).

    The program uses the OpenAI SDK, the client users have anywhere (its body pastes into any
    project). It runs under this very interpreter (its absolute path) when that one has the SDK
    (``make setup`` installs it into ``.venv``), else under ``python3``, with a first line saying
    what to install. ``temperature`` 0 in both: the same, right, answer every time (sampled,
    SmolLM2 answered "SUR" to the question 3 times in 4). ``cacert``: the service's ``tls_cert``,
    which both examples trust (a self-signed certificate is in no public store)."""
    from importlib.util import find_spec

    question = "What is the capital of France? Answer in one word."
    body = json.dumps(
        {
            "model": model,
            "max_tokens": 64,
            "temperature": 0,
            "messages": [{"role": "user", "content": question}],
        }
    )
    auth = ' -H "Authorization: Bearer $FORGE_API_KEY"' if keyed else ""
    key = 'os.environ["FORGE_API_KEY"]' if keyed else '"unused"'
    python = shlex.quote(sys.executable) if find_spec("openai") is not None else "python3"
    tls = f" --cacert {shlex.quote(str(cacert))}" if cacert is not None else ""
    verify = f", http_client=httpx.Client(verify={json.dumps(str(cacert))})" if cacert is not None else ""
    return [
        f"curl -s{tls} {url}/v1/chat/completions{auth} -H 'Content-Type: application/json' -d '{body}'",
        "# Python, with the OpenAI SDK" + ("" if python != "python3" else " (pip install openai)") + ":",
        f"{python} - <<'EOF'",
        *(["import os"] if keyed else []),
        *(["import httpx"] if cacert is not None else []),
        "from openai import OpenAI",
        f'client = OpenAI(base_url="{url}/v1", api_key={key}{verify})',
        "r = client.chat.completions.create(",
        f'    model="{model}", max_tokens=64, temperature=0,',
        f'    messages=[{{"role": "user", "content": "{question}"}}],',
        ")",
        "print(r.choices[0].message.content)",
        "EOF",
    ]


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
    watch: bool = typer.Option(
        False,
        "--watch",
        help="Reload when the config file or conf.d/*.toml beside it changes (server.watch_config).",
    ),
) -> None:
    """Run the supervisor: many models behind one OpenAI-compatible endpoint, until SIGTERM/Ctrl-C."""
    from ..config import load_config
    from ..process import SdNotifier
    from ..service import run_service, setup_logging

    settings = get_settings()
    cfg = load_config(config, settings)
    overrides = {
        k: v
        for k, v in {
            "host": host,
            "port": port,
            "log_format": log_format,
            "watch_config": True if watch else None,
        }.items()
        if v is not None
    }
    if overrides:
        cfg = cfg.with_server(**overrides)
    check_model_names(cfg)
    check_drafts(cfg, settings)
    check_adapters(cfg, settings)
    if check_config:
        n = len(cfg.models)
        err_console.print(
            f"config OK: {cfg.source or 'defaults'} ({n} model{'' if n == 1 else 's'})", markup=False
        )
        for note in missing_model_files(cfg):
            err_console.print(note, markup=False)
        return
    setup_logging(cfg.server.log_format, settings)
    notifier = SdNotifier.from_settings(settings)
    source = cfg.source

    def reload_config() -> Any:
        new = load_config(source, settings)
        return new.with_server(**overrides) if overrides else new

    listening: list[str] = []

    def on_listening(url: str, ollama_url: str | None) -> None:
        listening.append(url)
        console.print(url, markup=False)
        names = ", ".join(cfg.models) or "none"
        cert = cfg.server.tls_cert
        tls = f"TLS, certificate {cert}" if cert is not None else "plain HTTP, no TLS"
        err_console.print(
            f"forge serve listening on {url} ({tls}; OpenAI base URL {url}/v1); models: {names}", markup=False
        )
        if ollama_url is not None:  # with `ollama_port = 0` this line is the only way to find it
            err_console.print(f"Ollama API also on {ollama_url} (server.ollama_port)", markup=False)
        if cfg.models:
            keyed = cfg.server.api_key is not None or bool(cfg.server.keys)
            err_console.print("try it (paste into a shell):", markup=False)
            if keyed and not os.environ.get("FORGE_API_KEY"):
                which = "server.api_key" if cfg.server.api_key is not None else "a [[server.keys]] key"
                err_console.print(f"# first: export FORGE_API_KEY=<{which} of your config>", markup=False)
            for line in usage_examples(url, next(iter(cfg.models)), keyed=keyed, cacert=cert):
                err_console.print(line, markup=False, highlight=False, soft_wrap=True)

    import anyio  # start-up time: only serve runs an event loop here

    from ..service import loop_options

    def on_stopped(signame: str, running: list[str]) -> None:
        """One line at the end (Ctrl-C on `make run` printed nothing): what was stopped."""
        where = f"forge serve at {listening[0]}" if listening else "forge serve"
        if not running:
            what = f"{where} (no model was running)"
        else:
            servers = "llama-server of" if len(running) == 1 else "llama-servers of"
            what = f"{where} and the {servers} {', '.join(running)}"
        err_console.print(f"stopped ({signame}): {what}", markup=False)

    anyio.run(
        lambda: run_service(
            cfg,
            settings,
            config_path=source,
            load_config=reload_config if source is not None else None,
            notifier=notifier,
            on_listening=on_listening,
            on_stopped=on_stopped,
        ),
        backend_options=loop_options(),
    )


def _fmt_bytes(n: int | None) -> str:
    return format_bytes(n) if n else "-"


#: ``forge ps`` columns, least important last: on a narrow terminal they go from the end, so that
#: a model's name is the last thing to be shortened.
_PS_COLUMNS = (
    "name",
    "state",
    "backend",
    "rules",
    "pid",
    "devices",
    "port",
    "ctx per request",
    "restarts",
    "memory est/actual",
    "uptime",
    "contexts",
    "last error",
)


def _ps_cells(r: dict[str, Any]) -> list[str]:
    mem = r.get("memory") or {}
    est = sum((mem.get("estimated_bytes") or {}).values())
    act = sum(
        sum(parts.values()) if isinstance(parts, dict) else int(parts)
        for parts in (mem.get("actual_bytes") or {}).values()
    )
    if act:  # what it holds: its allocations and, on a GPU, the backend's context (in the estimate too)
        act += sum(int(v) for v in (mem.get("context_bytes") or {}).values())
    up = r.get("uptime")
    return [
        str(r["name"]),
        str(r["state"]) + (" (sleeping)" if r.get("sleeping") else ""),
        str(r.get("backend") or "llama") + (f" {r['peer']}" if r.get("peer") else ""),
        _rules(r.get("residency") or {}),
        str(r.get("pid") or "-"),
        _devices(r),
        str(r.get("port") or "-"),
        _context(r),
        str(r.get("restarts", 0)),
        f"{_fmt_bytes(est)} / {_fmt_bytes(act)}",
        f"{up:.0f} s" if up else "-",
        _contexts(r),
        _short(str(r.get("last_error") or "")),
    ]


_ERROR_CELL = 60


def _rules(residency: dict[str, Any]) -> str:
    """The residency rules in a few words: ``pinned``, ``never swap``, ``group chat``, ``default``."""
    words = []
    if residency.get("pinned"):
        words.append("pinned")
    if residency.get("swap") == "never":
        words.append("never swap")
    if residency.get("group"):
        words.append(f"group {residency['group']}")
    if residency.get("default"):
        words.append("default")
    cost = residency.get("evict_cost")
    if cost not in (None, 1, 1.0):
        words.append(f"cost {cost:g}")
    return ", ".join(words) or "-"


def _short(text: str) -> str:
    return text if len(text) <= _ERROR_CELL else text[: _ERROR_CELL - 1] + "…"


def _context(r: dict[str, Any]) -> str:
    """Tokens one request can use (``/v1/models``' ``context_length``) and how the slots hold it."""
    c = r.get("context") or {}
    if not c:
        return "-"
    per, slots = c.get("per_request"), int(c.get("parallel") or 1)
    auto = "auto" in c  # ctx_size = "auto": chosen at each load
    if per is None:
        # not started yet: auto chooses at load; an unset ctx_size is the GGUF's own, read at load
        return "auto" if auto else "trained"
    if slots == 1:
        text = str(per)
    elif c.get("kv_unified"):
        text = f"{per} ({slots} slots share it)"
    else:
        text = f"{per} (each of {slots} slots)"
    return f"{text} auto" if auto else text


def _contexts(r: dict[str, Any]) -> str:
    """Saved contexts (keep_context): how many, their tokens and bytes, "-" when none; with the
    conversation tier, its returning turns found and restored (or why it is off)."""
    c = r.get("contexts") or {}
    if not c.get("count"):
        text = "-" if not r.get("keep_context") else "0"
    else:
        text = f"{c['count']} ({c.get('tokens', 0)} tok, {_fmt_bytes(int(c.get('bytes', 0)))})"
    if c.get("conversation_off"):
        return f"{text}; conversations off"
    if "conversation_hits" in c:
        text += f"; {c['conversation_hits']} found, {c.get('conversation_restores', 0)} restored"
    return text


def _fit_columns(rows: list[list[str]], width: int) -> int:
    """How many leading columns fit in ``width`` (a rich table cell costs its text plus 3)."""
    need = [max([len(h), *(len(row[i]) for row in rows)]) + 3 for i, h in enumerate(_PS_COLUMNS)]
    keep = len(need)
    while keep > 1 and sum(need[:keep]) + 1 > width:
        keep -= 1
    return keep


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
    cells = [_ps_cells(r) for r in rows]
    keep = _fit_columns(cells, console.width)
    from rich.table import Table  # start-up time: commands import what they use

    t = Table(*_PS_COLUMNS[:keep])
    t.columns[0].no_wrap = False
    t.columns[0].overflow = "fold"  # only when the name alone is wider than the terminal
    for row in cells:
        t.add_row(*(escape(c) for c in row[:keep]))
    console.print(t)
    for r in rows:  # a variant or adapter is no model of its own: shown with the model serving it
        also = [f"{n} (variant)" for n in r.get("variants") or []]
        also += [f"{n} (adapter)" for n in r.get("adapters") or []]
        if also:
            console.print(f"{r['name']} also serves {', '.join(also)}", markup=False, highlight=False)
    # A reason is what a user acts on: in full below the table (wrapped) wherever the cell cut it
    # or the terminal left the column out.
    for r in rows:
        error = str(r.get("last_error") or "")
        if error and (keep < len(_PS_COLUMNS) or len(error) > _ERROR_CELL):
            console.print(f"{r['name']}: {error}", markup=False, highlight=False)
    for r in rows:  # the queue per priority class and key, where anything waits
        queued = queue_line(r)
        if queued:
            console.print(queued, markup=False, highlight=False)
    if keep < len(_PS_COLUMNS):
        err_console.print(
            f"({len(_PS_COLUMNS) - keep} columns left out for the terminal width: --json shows all)",
            markup=False,
        )


def queue_line(row: dict[str, Any]) -> str | None:
    """``NAME: queued 2 interactive, 5 batch, 0 background (keys: a 3, night 4)``, or None when
    nothing waits for the model."""
    queue = row.get("queue") or {}
    waiting = queue.get("waiting") or {}
    if not any(waiting.values()):
        return None
    classes = ", ".join(f"{n} {c}" for c, n in waiting.items())
    keys = ", ".join(f"{k} {n}" for k, n in sorted((queue.get("waiting_by_key") or {}).items()))
    return f"{row['name']}: queued {classes}" + (f" (keys: {keys})" if keys else "")


def unload(
    name: str = typer.Argument(...),
    config: Path | None = _CONFIG_OPT,
    forget: bool = typer.Option(
        False, "--forget", help="Do not save its context (keep_context), and delete what was saved."
    ),
) -> None:
    """Drain and stop a model in the running service (keep_context: its slots are saved first)."""
    client = connect_service(config, required=True)
    before = next((r for r in client.models() if r.get("name") == name), None)
    status = client.unload(name, forget=forget)
    err_console.print(_unloaded(name, status, before, forget=forget), markup=False)


def _unloaded(name: str, status: dict[str, Any], before: dict[str, Any] | None, *, forget: bool) -> str:
    """``forge unload``'s line: the state, and for a keep_context model what became of its context
    (saved for the next load, nothing to save, or deleted with --forget)."""
    line = f"{name}: {status['state']}"
    if not status.get("keep_context"):
        return line
    if forget:
        return f"{line}; its saved context was deleted (--forget)"
    now = status.get("contexts") or {}
    saved = int(now.get("saves") or 0) - int(((before or {}).get("contexts") or {}).get("saves") or 0)
    if saved > 0:
        return (
            f"{line}; its context was saved ({saved} slot{'' if saved == 1 else 's'}, "
            f"{int(now.get('tokens') or 0)} tokens, {_fmt_bytes(int(now.get('bytes') or 0))}): "
            "the next load restores it"
        )
    if before is not None and before.get("state") == "ready":
        return f"{line}; no context to save (its slots held none)"
    return line


def _reload_summary(summary: dict[str, Any]) -> str:
    parts = []
    for key in ("changed", "added", "removed", "unchanged"):
        names = [str(n) for n in summary.get(key) or []]
        parts.append(
            f"{len(names)} {key}" + (f" ({', '.join(names)})" if names and key != "unchanged" else "")
        )
    pending = [str(k) for k in summary.get("restart_required") or []]
    restart = f"; {', '.join(pending)}: applied at the next restart of forge serve" if pending else ""
    return "config reloaded: " + ", ".join(parts) + restart


def reload(
    config: Path | None = _CONFIG_OPT,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Ask the running service to re-read its config (same as SIGHUP)."""
    client = connect_service(config, required=True)
    summary = client.reload()
    if as_json:
        console.print_json(json.dumps(summary))
        return
    console.print(_reload_summary(summary), markup=False)


def logs(
    name: str = typer.Argument(...),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines."),
    tail: int = typer.Option(200, "--tail", "-n", min=0),
    every: bool = typer.Option(
        False, "--all", help="Every line as written (runs of 'all slots are idle' are collapsed otherwise)."
    ),
    config: Path | None = _CONFIG_OPT,
) -> None:
    """A model's llama-server log from the running service."""
    client = connect_service(config, required=True)
    try:
        for line in client.logs(name, tail=tail, follow=follow, every=every):
            console.print(line, markup=False, highlight=False)
    except KeyboardInterrupt:
        return


def service_serving(model: str, *, url: str | None = None, config: Path | None = None) -> Any:
    """The running ``forge serve`` that serves ``model`` by name, else None (the caller starts a
    private llama-server). With ``url`` that service must answer and serve it: an error otherwise."""
    client = connect_service(config, required=False, url=url)
    if client is None:
        return None
    names = [str(r["name"]) for r in client.models()]
    if model in names:
        return client
    client.close()
    if url is not None:
        raise UsageError(
            f"the forge service at {url} does not serve {model!r} (it serves: {', '.join(names) or 'nothing'})",
            hint="use one of its names, or leave --url out to start a private llama-server",
        )
    return None


def load_via_service(model: str, config: Path | None, *, url: str | None = None) -> bool:
    """``forge load NAME`` with a service running: load it there. False when no service answers
    (or it does not know the name), so the caller falls back to the foreground mode."""
    client = service_serving(model, url=url, config=config)
    if client is None:
        return False
    status, seconds = load_in_service(client, model)
    err_console.print(
        f"{model}: {status['state']} (pid {status.get('pid')}, devices {','.join(status.get('devices') or [])}) "
        f"in {seconds:.1f} s — OpenAI base URL {client.base_url}/v1",
        markup=False,
    )
    return True


def load_in_service(client: Any, model: str) -> tuple[dict[str, Any], float]:
    """Ask the service to load ``model`` (a no-op when it is loaded), showing its progress."""
    t0 = time.monotonic()
    with err_console.status(
        f"loading {escape(model)} in the forge service at {escape(client.base_url)} …"
    ) as spinner:
        # Progress from the same event stream the control API serves: state changes as they come.
        from ..service import ServiceClient

        watcher = ServiceClient(client.base_url, client.api_key, verify=client.verify)

        def follow() -> None:
            try:
                for ev in watcher.events():
                    if ev.get("model") == model:
                        spinner.update(
                            escape(
                                f"{model}: {ev.get('kind')} {ev.get('state') or ''} {ev.get('data') or ''}"
                            )
                        )
            except Exception:  # noqa: S110 — progress display only; closed under us when the load returns
                pass

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        try:
            status = client.load(model)
        finally:
            watcher.close()
    return status, time.monotonic() - t0


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("ps")(ps)
    app.command("unload")(unload)
    app.command("logs")(logs)
    app.command("reload")(reload)
