"""``forge gpus`` and ``forge doctor``: what the supervisor can place models on, and whether it can serve."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from ._common import console, get_settings

if TYPE_CHECKING:
    from rich.table import Table

    from ..config import ForgeSettings
    from ..hardware import Device, Inventory

__all__ = ["register"]

GiB = 1 << 30
_STYLE = {"pass": "green", "warn": "yellow", "fail": "red"}


def _mask(device: Device, inventory: Inventory, settings: ForgeSettings) -> str:
    """The variables that select the device (the full set is in ``--json``)."""
    from ..hardware import child_env  # start-up time: commands import what they use

    if not device.usable:
        return "—"
    if device.vendor == "cpu":
        return "all GPUs hidden"
    env = child_env([device], inventory, settings)
    keys = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    return " ".join(f"{k}={env[k]}" for k in keys if env.get(k) not in (None, "-1"))


def _memory_kind(device: Device) -> str:
    """What the memory figures of a device are: the CPU's are system RAM (the JSON keeps the one
    ``vram_*`` key set for every device, placement compares them alike), an APU's its carve-out
    plus the GTT it maps from RAM, a discrete GPU's its VRAM."""
    if device.vendor == "cpu":
        return "RAM"
    return "VRAM+GTT" if device.integrated and device.gtt_total_bytes else "VRAM"


def _table(inventory: Inventory, settings: ForgeSettings) -> Table:
    from rich.table import Table  # start-up time: only the table output needs it

    table = Table(header_style="bold")
    for column in ("index", "vendor", "name", "gfx / cc", "memory", "iGPU", "usable", "mask"):
        table.add_column(column, overflow="fold")
    for d in inventory.devices:
        used, total = d.vram_used_bytes / GiB, d.vram_total_bytes / GiB
        table.add_row(
            str(d.index) if d.index >= 0 else "—",
            d.vendor,
            escape(d.name),
            d.gfx_target or d.compute_capability or (f"{d.cores} cores" if d.cores else ""),
            f"{used:.1f}/{total:.1f} GiB {_memory_kind(d)}",  # used/total
            "yes" if d.integrated else "no",
            "[green]yes[/]" if d.usable else "[yellow]no[/]",
            escape(_mask(d, inventory, settings)),
        )
    return table


def gpus(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List the devices models can be placed on: GPUs as the child llama-server sees them, and the CPU."""
    from ..hardware import detect, inventory_json  # start-up time: commands import what they use

    settings = get_settings()
    inventory = detect(settings)
    if as_json:
        console.print_json(json.dumps(inventory_json(inventory, settings)))
        return
    console.print(_table(inventory, settings))
    for d in inventory.devices:
        if not d.usable:
            console.print(f"[yellow]{escape(d.key)} not used:[/] {escape(d.skip_reason or '')}")
    kfd = inventory.kfd
    state = "accessible" if kfd.accessible else ("present, not accessible" if kfd.present else "not present")
    console.print(
        f"/dev/kfd: {state}" + (f" — {kfd.hint}" if kfd.hint and inventory.gpus else ""), markup=False
    )
    for probe in inventory.probes:
        console.print(f"{probe.name}: {'yes' if probe.available else 'no'} ({probe.detail})", markup=False)
    for note in inventory.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")


def doctor(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    no_cross_check: bool = typer.Option(
        False, "--no-cross-check", help="Skip running llama-server --list-devices under each mask."
    ),
) -> None:
    """Check /dev/kfd, ROCm, amdsmi, NVML, llama-server and the device masks; exit 1 if nothing can serve."""
    from ..doctor import run_doctor  # start-up time: commands import what they use

    settings = get_settings()
    report = run_doctor(settings, cross_check_masks=not no_cross_check)
    if as_json:
        console.print_json(json.dumps(report.to_json(settings)))
        raise typer.Exit(report.exit_code)
    for check in report.checks:
        style = _STYLE[check.status]
        console.print(f"[{style}]{check.status:4}[/] [bold]{escape(check.name)}[/]: {escape(check.message)}")
        if check.fix and check.status != "pass":
            console.print(f"      fix: {escape(check.fix)}", style="dim")
    if report.can_serve:
        console.print("[green]ok:[/] a model can be served")
    else:
        console.print("[red]not ok:[/] no model can be served until the failures above are fixed")
    raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    """Add ``forge gpus`` and ``forge doctor`` to ``app``."""
    app.command("gpus")(gpus)
    app.command("doctor")(doctor)
