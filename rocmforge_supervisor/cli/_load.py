"""``forge load`` and ``forge chat``: one model in the foreground."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from .._errors import ForgeError
from .._units import format_bytes
from ..config import GpuChoice, GpuLayers, parse_gpu, parse_gpu_layers  # ``_values`` only: config is lazy
from ..models._catalog import DEFAULT_MODEL, embedded_models
from ._common import console, err_console, get_settings

if TYPE_CHECKING:
    from rich.panel import Panel

    from ..client import Message

__all__ = ["register"]


def _gpu_option(value: str) -> GpuChoice:
    try:
        return parse_gpu(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--gpu") from None


def _ngl_option(value: str | None) -> GpuLayers:
    try:
        return parse_gpu_layers(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--n-gpu-layers") from None


def _sigterm_as_interrupt() -> None:
    """SIGTERM stops the foreground model the same clean way Ctrl-C does."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _load(model: str, **kw: Any) -> Any:
    from ..supervisor import load_model

    settings = get_settings()
    t0 = time.monotonic()
    with err_console.status(f"loading {escape(model)} …", spinner="dots"):
        tm = load_model(model, settings=settings, **kw)
    return tm, time.monotonic() - t0


#: The question every printed example asks: one a 135M instruct model answers right at
#: temperature 0 ("Paris"), so the first thing a new user sees is a right answer.
QUESTION = "What is the capital of France? Answer in one word."
#: Its text-completion form, for a base model (no chat template to put a question in).
SAMPLE_TEXT = "The capital of France is"


def try_curl(openai_base_url: str, *, chat: bool, auth: str = "") -> str:
    """The ``curl`` that ``forge load`` prints: the chat route for a model with a chat template
    (an instruct model asked through ``/completions`` stops at once), text completion for a base
    model; ``temperature`` 0 so that it answers the same, right, thing every time."""
    if chat:
        route = "chat/completions"
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16, "temperature": 0}
    else:
        route = "completions"
        body = {"prompt": SAMPLE_TEXT, "max_tokens": 16, "temperature": 0}
    return (
        f"curl -s {openai_base_url}/{route}{auth} -H 'Content-Type: application/json' -d '{json.dumps(body)}'"
    )


def has_chat_template(tm: Any) -> bool:
    """Whether the model in this foreground child carries its own chat template (GGUF metadata).
    A base model without one (gemma-3-270m) gets text completion."""
    return bool(tm.plan.info.has_chat_template)


def _summary(tm: Any, seconds: float) -> Panel:
    from rich.panel import Panel  # start-up time: commands import what they use
    from rich.table import Table

    server = tm.server
    plan = tm.plan
    t = Table.grid(padding=(0, 2))
    t.add_row("model", escape(f"{plan.spec.alias}  ({plan.model_path})"))
    t.add_row("pid / port", f"{server.pid} / {server.port}")
    t.add_row("device(s)", escape(", ".join(plan.devices)))
    est = getattr(plan.estimate, "total_bytes", None)
    actual = sum(plan.actual.device_totals().values()) if plan.actual else 0
    if est:
        t.add_row("memory", f"estimated {format_bytes(est)}, allocated {format_bytes(actual)}")
    t.add_row("loaded in", f"{seconds:.2f} s (llama-server ready after {server.load_seconds:.2f} s)")
    t.add_row("OpenAI base URL", escape(tm.openai_base_url))
    auth = ""
    if server.api_key:
        t.add_row("API key", escape(f"{server.api_key}  (send it as: Authorization: Bearer <key>)"))
        auth = f" -H 'Authorization: Bearer {server.api_key}'"
    else:
        t.add_row("API key", "none (loopback only)")
    t.add_row("try", escape(try_curl(tm.openai_base_url, chat=has_chat_template(tm), auth=auth)))
    t.add_row("log", escape(str(server.log.path or plan.spec.log_path)))
    return Panel(t, title="forge load", expand=False)


_URL_OPT = typer.Option(
    None, "--url", help="The forge service to use (default: the local one, when it serves MODEL)."
)
_PRIVATE_OPT = typer.Option(
    False, "--private", help="Start a llama-server for this command even when a service serves MODEL."
)
_CONFIG_OPT = typer.Option(
    None,
    "--config",
    help="The service's forge.toml, for its server.api_key (default: XDG config, then /etc/rocmforge).",
)


def local_file(model: str) -> bool:
    """Whether MODEL names a file here rather than a model of the service: an existing file, or a
    ``.gguf`` / explicit path. Such a MODEL is never asked of the service (whose answer would be
    about a key or a name, not about the file): a missing or bad file gets its own error."""
    if model.startswith("hf:") or model in embedded_models():
        return False
    if model.lower().endswith(".gguf") or model.startswith(("/", "./", "../", "~")):
        return True
    return Path(model).expanduser().is_file()


def _stream_prompt(tm: Any, prompt: str, max_tokens: int, temperature: float, *, chat: bool) -> None:
    """One answer to ``prompt`` on stdout: as a user turn through the model's chat template when it
    has one (what ``forge chat``, ``ollama run`` and ``llama-cli`` do), else as text to continue."""
    if chat:
        from ..client import Message  # httpx, anyio: start-up time that other commands need not pay

        tokens = tm.chat([Message("user", prompt)], max_tokens=max_tokens, temperature=temperature)
    else:
        tokens = tm.generate(prompt, max_tokens=max_tokens, temperature=temperature)
    for tok in tokens:
        if tok.reasoning:
            continue
        sys.stdout.write(tok.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    u = tm.last_usage
    tps = (tm.last_timings or {}).get("predicted_per_second")
    if u is not None:
        err_console.print(
            f"{u.prompt_tokens} prompt + {u.completion_tokens} completion tokens"
            + (f", {tps:.1f} tokens/s" if tps else "")
            + f", finish: {tm.last_finish_reason}",
            style="dim",
            markup=False,
        )


def _service_model(
    model: str, url: str | None, private: bool, config: Path | None = None
) -> tuple[Any, bool] | None:
    """A TextModel over the running service when it serves ``model`` (loaded there first), and
    whether the model's GGUF has a chat template (the service's ``/api/show`` says)."""
    if private or (url is None and local_file(model)):
        return None
    from ..client import TextModel
    from ._serve import load_in_service, service_serving

    client = service_serving(model, url=url, config=config)
    if client is None:
        return None
    load_in_service(client, model)
    err_console.print(
        f"using {model} on the forge service at {client.base_url} "
        "(add --private for a llama-server of this command's own)",
        style="dim",
        markup=False,
    )
    chat = client.has_chat_template(model)
    return TextModel.connect(client.base_url, model=model, api_key=client.api_key, verify=client.verify), chat


def _key_option(api_key: str | None, no_api_key: bool) -> str | None:
    if api_key is not None and no_api_key:
        raise typer.BadParameter("give --api-key or --no-api-key, not both", param_hint="--api-key")
    if api_key is not None and (
        not api_key.strip() or not api_key.isascii() or any(c.isspace() for c in api_key)
    ):
        raise typer.BadParameter("use printable ASCII without spaces", param_hint="--api-key")
    return "" if no_api_key else api_key


def load(
    model: str = typer.Argument(
        ..., help=f"A .gguf path, an embedded name ({', '.join(embedded_models())}), or hf:org/repo:QUANT."
    ),
    prompt: str | None = typer.Option(
        None,
        "--prompt",
        "-p",
        help="Stream one answer and exit (a chat turn when the model has a chat template).",
    ),
    raw: bool = typer.Option(
        False, "--raw", help="With --prompt: send it as raw text to complete, without the chat template."
    ),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n", min=0, help="With --prompt."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="With --prompt."),
    ctx_size: int | None = typer.Option(
        None, "--ctx-size", "-c", min=0, help="Context size (0 = the model's)."
    ),
    n_gpu_layers: str | None = typer.Option(
        None, "--n-gpu-layers", "-ngl", help="Layers on the GPU: N, auto, all."
    ),
    parallel: int | None = typer.Option(None, "--parallel", "-np", min=1, help="Parallel slots."),
    gpu: str = typer.Option("auto", "--gpu", help="auto, cpu, an index (0) or a list (0,1)."),
    port: int | None = typer.Option(
        None, "--port", min=1, max=65535, help="Port for llama-server (default: a free one)."
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", help="The key clients send (default: a new random one each run)."
    ),
    no_api_key: bool = typer.Option(
        False, "--no-api-key", help="No key at all (llama-server listens on 127.0.0.1 only)."
    ),
    alias: str | None = typer.Option(
        None, "--alias", help="Model name in the API (default: the file's stem)."
    ),
    url: str | None = _URL_OPT,
    private: bool = _PRIVATE_OPT,
    config: Path | None = _CONFIG_OPT,
) -> None:
    """Load MODEL in llama-server and serve it in the foreground until Ctrl-C (or answer --prompt).

    With a `forge serve` running that knows MODEL by name, the service loads (and answers) it
    instead, and the command exits once it is loaded; --private starts a llama-server of this
    command's own. A file path is always loaded here.
    """
    _sigterm_as_interrupt()
    key = _key_option(api_key, no_api_key)
    # A port or key of its own is about this command's child: the service has its own. A file is
    # checked (and loaded) here before any service is asked about it.
    private = private or port is not None or key is not None or (url is None and local_file(model))
    if not private:
        if prompt is None:
            from ._serve import load_via_service

            if load_via_service(model, config, url=url):
                return
        else:
            found = _service_model(model, url, private, config)
            if found is not None:
                remote, chat = found
                with remote:
                    _stream_prompt(remote, prompt, max_tokens, temperature, chat=chat and not raw)
                return
    kw = {
        "ctx_size": ctx_size,
        "n_gpu_layers": _ngl_option(n_gpu_layers),
        "parallel": parallel,
        "gpu": _gpu_option(gpu),
        "port": port,
        "alias": alias,
        "api_key": key,
    }
    tm, seconds = _load(model, **kw)
    with tm:
        if prompt is not None:
            _stream_prompt(tm, prompt, max_tokens, temperature, chat=has_chat_template(tm) and not raw)
            return
        err_console.print(_summary(tm, seconds))
        console.print(tm.openai_base_url, markup=False)
        try:
            chat = has_chat_template(tm)
            sample = QUESTION if chat else SAMPLE_TEXT
            err_console.print(f"[dim]sample:[/] {sample}" + (" → " if chat else ""), end="")
            try:
                if chat:
                    from ..client import Message

                    tokens = tm.chat([Message("user", sample)], max_tokens=24, temperature=0.0)
                else:
                    tokens = tm.generate(sample, max_tokens=24, temperature=0.0)
                for tok in tokens:
                    if not tok.reasoning:
                        err_console.print(tok.text, end="", markup=False, highlight=False)
            finally:
                err_console.print()
            err_console.print("serving until Ctrl-C …")
            tm.wait_exit()
        except KeyboardInterrupt:  # Ctrl-C (or SIGTERM): a clean stop is a success
            err_console.print("stopping …")
            return
        crash = tm.err() or ForgeError(f"llama-server exited: {tm.server.status()['exit']}")
        raise crash


#: What ``forge chat`` does itself with a line that starts with "/" (as ``ollama run`` does):
#: nothing that starts with "/" goes to the model, unknown commands included — a ``/help`` the
#: model answered as a question taught nothing. ``//text`` sends "/text".
CHAT_HELP = (
    "/help     this list\n"
    "/reset    forget the conversation (the --system prompt stays)\n"
    "/exit     quit (also /quit, /bye, Ctrl-D)\n"
    "//text    send /text to the model"
)
_EXIT = frozenset({"/exit", "/quit", "/bye"})


def _chat_loop(tm: Any, system: str | None, max_tokens: int, temperature: float) -> None:
    from ..client import Message  # httpx, anyio: start-up time that other commands need not pay

    history: list[Message] = [Message("system", system)] if system else []
    while True:
        try:
            line = console.input("[bold green]you>[/] ")
        except (EOFError, KeyboardInterrupt):
            console.print()
            return
        command = line.strip()
        if not command:
            continue
        if command.startswith("/") and not command.startswith("//"):
            word = command.split()[0].lower()
            if word in _EXIT:
                return
            if word == "/reset":
                history = history[:1] if system else []
                console.print("(conversation cleared)", style="dim", markup=False)
            elif word in ("/help", "/?"):
                console.print(CHAT_HELP, style="dim", markup=False, highlight=False)
            else:
                console.print(
                    f"unknown command {word} (not sent to the model): /help lists the commands, "
                    "//text sends /text",
                    style="yellow",
                    markup=False,
                    highlight=False,
                )
            continue
        if command.startswith("//"):
            line = line.lstrip()[1:]
        history.append(Message("user", line))
        reply: list[str] = []
        console.print("[bold blue]model>[/] ", end="")
        try:
            for tok in tm.chat(history, max_tokens=max_tokens, temperature=temperature):
                if not tok.reasoning:
                    reply.append(tok.text)
                    console.print(tok.text, end="", markup=False, highlight=False)
        except KeyboardInterrupt:
            console.print(" [dim](interrupted)[/]")
        console.print()
        history.append(Message("assistant", "".join(reply)))


def chat(
    model: str = typer.Argument(
        DEFAULT_MODEL,
        help="A service's model name, a .gguf path or an embedded name (default: the chat model).",
    ),
    system: str | None = typer.Option(None, "--system", help="A system prompt."),
    max_tokens: int = typer.Option(512, "--max-tokens", "-n", min=1),
    temperature: float = typer.Option(0.7, "--temperature", min=0.0),
    ctx_size: int | None = typer.Option(4096, "--ctx-size", "-c", min=0),
    gpu: str = typer.Option("auto", "--gpu"),
    url: str | None = _URL_OPT,
    private: bool = _PRIVATE_OPT,
    config: Path | None = _CONFIG_OPT,
) -> None:
    """An interactive streaming chat with MODEL (history kept; /reset clears it, /exit or Ctrl-D quits,
    /help lists the commands: lines that start with / never go to the model).

    With a `forge serve` running that serves MODEL by name, the chat goes to it (no second
    llama-server); --private starts one of this command's own.
    """
    _sigterm_as_interrupt()
    found = _service_model(model, url, private, config)
    if found is not None:
        with found[0] as remote:
            _chat_loop(remote, system, max_tokens, temperature)
        return
    tm, seconds = _load(model, ctx_size=ctx_size, gpu=_gpu_option(gpu))
    with tm:
        err_console.print(
            f"{tm.plan.spec.alias} ready in {seconds:.1f} s — /help, /reset, /exit", style="dim", markup=False
        )
        _chat_loop(tm, system, max_tokens, temperature)


def register(app: typer.Typer) -> None:
    app.command("load")(load)
    app.command("chat")(chat)
