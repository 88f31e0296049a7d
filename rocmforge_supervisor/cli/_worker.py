"""``forge worker``: llama.cpp RPC workers on this machine's devices, supervised, for a bigger box's
``forge serve`` (or any ``llama-server --rpc``) to place model layers on.

One rpc-server per GPU, each masked to its GPU (the same masks a llama-server child gets), on
consecutive ports from ``--port``; on a machine without usable GPUs (or with ``--cpu``), one for
the CPU. Per device rather than one for all because rpc-server serves one client at a time: one
process per GPU lets two models use two GPUs of this box, and a GPU that faults takes down only
its own worker.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import signal
from pathlib import Path

import typer

from .._errors import UsageError
from ._common import console, err_console, get_settings

__all__ = ["register"]

_NO_AUTH = (
    "rpc-server has no authentication and no encryption: anyone who can reach {addr} can allocate "
    "and read this machine's device memory and run computations on it; use a private network or a "
    "tunnel only"
)


def worker(
    host: str = typer.Option("127.0.0.1", "--host", "-H", help="Address to listen on (default loopback)."),
    port: int = typer.Option(50052, "--port", "-p", min=1, max=65535, help="First port; one per device."),
    allow_network: bool = typer.Option(
        False,
        "--allow-network",
        help="Needed to listen on a non-loopback address: rpc-server has no authentication.",
    ),
    cpu: bool = typer.Option(False, "--cpu", help="One worker on the CPU, even when there are GPUs."),
    devices: str | None = typer.Option(
        None, "--devices", help="Only these devices, by `forge gpus` key: 'amd:0,amd:1'."
    ),
    threads: int | None = typer.Option(
        None, "--threads", "-t", min=1, help="CPU threads of a CPU worker (default: all cores)."
    ),
    cache: bool = typer.Option(False, "--cache", help="rpc-server's local tensor cache (-c)."),
    rpc_server: Path | None = typer.Option(None, "--rpc-server", help="The ggml-rpc-server binary to run."),
) -> None:
    """Run llama.cpp RPC workers (rpc-server) on this machine's devices until SIGTERM/Ctrl-C."""
    import anyio  # start-up time: commands import what they use

    from ..binaries import locate_rpc_server
    from ..hardware import child_env, detect
    from ..process import ChildEvent, is_loopback_host, run_supervised, worker_specs

    settings = get_settings()
    try:  # rpc-server binds an IPv4 literal (inet_addr); anything else fails after the start
        ipaddress.IPv4Address(host)
    except ValueError:
        raise UsageError(
            f"--host {host!r} is not an IPv4 address: rpc-server listens on IPv4 addresses only",
            hint="use 127.0.0.1 (the default) or this machine's private IPv4 address",
        ) from None
    if not is_loopback_host(host):
        if not allow_network:
            raise UsageError(
                f"refusing to listen on {host}: " + _NO_AUTH.format(addr=f"{host}:{port}"),
                hint="add --allow-network if this address is on a private network or a tunnel",
            )
        err_console.print("warning: " + _NO_AUTH.format(addr=f"{host}:{port}"), markup=False)
    binary = locate_rpc_server(settings, configured=rpc_server)
    inventory = detect(settings)
    gpus = list(inventory.gpus)
    if devices:
        keys = list(dict.fromkeys(k.strip() for k in devices.split(",") if k.strip()))
        known = {d.key: d for d in inventory.devices}
        missing = [k for k in keys if k not in known]
        if missing:
            raise UsageError(f"no device {', '.join(missing)} here", hint="run `forge gpus` to see the keys")
        unusable = [f"{k} ({known[k].skip_reason or 'not usable'})" for k in keys if not known[k].usable]
        if unusable:
            raise UsageError(
                f"device {', '.join(unusable)} cannot run a worker", hint="pick another with `forge gpus`"
            )
        gpus = [known[k] for k in keys if known[k].vendor != "cpu"]
        cpu = cpu or not gpus
    if cpu or not gpus:
        groups = [("cpu", (), child_env([], inventory, settings))]
        threads = threads or os.cpu_count() or 1
    else:
        groups = [(d.key, (), child_env([d], inventory, settings)) for d in gpus]
    if port + len(groups) - 1 > 65535:
        raise UsageError(
            f"{len(groups)} workers from port {port} go past 65535",
            hint=f"use --port {65536 - len(groups)} or lower",
        )
    specs = worker_specs(
        binary,
        host=host,
        port=port,
        groups=groups,
        threads=threads,
        cache=cache,
        log_dir=settings.logs_dir,
        state_dir=settings.state_dir,
    )
    ready: set[str] = set()

    def on_event(name: str, event: ChildEvent, detail: str) -> None:
        # The event's name is the supervisor's word for it (crash, restart …), in brackets.
        err_console.print(f"worker {name}: {detail} [{event}]", markup=False)
        if event == ChildEvent.READY and name not in ready:
            ready.add(name)
            spec = next(s for s in specs if s.name == name)
            console.print(spec.address)  # stdout: the addresses, for scripts and [[workers]]
            if len(ready) == len(specs):
                from ..process import SdNotifier

                SdNotifier.from_settings(settings).ready(f"{len(specs)} rpc worker(s) listening")

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for spec in specs:
                tg.start_soon(functools.partial(run_supervised, spec, on_event=on_event))
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _sig in signals:
                    err_console.print("stopping workers", markup=False)
                    tg.cancel_scope.cancel()
                    break

    from ..process import unwrap_group

    try:
        anyio.run(main)
    except BaseExceptionGroup as group:
        raise unwrap_group(group) from None


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
