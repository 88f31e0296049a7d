"""The tables ``forge inspect`` prints: a GGUF's metadata, its projector, and the memory a load
would take, device by device. Kept apart from the commands (``_models``) for their size; the MiB
figures (:func:`mib`) are ``forge pull --fit``'s too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape

if TYPE_CHECKING:
    from rich.table import Table

    from ..models import GGUFInfo, MemoryEstimate, ProjectorInfo

__all__ = ["estimate_table", "info_table", "mib", "projector_table"]

_MIB = 1024 * 1024


def mib(n: int) -> str:
    """``n`` bytes in MiB, to one decimal (``1,234.5``)."""
    return f"{n / _MIB:,.1f}"


def _params(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def info_table(info: GGUFInfo) -> Table:
    from rich.table import Table  # start-up time: commands import what they use

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("file", str(info.path)),
        ("name", info.name or "—"),
        ("architecture", info.architecture),
        ("parameters", f"{_params(info.parameter_count)} ({info.parameter_count:,})"),
        ("quantization", info.file_type),
        ("trained context", f"{info.context_length:,}" if info.context_length else "—"),
        ("layers", str(info.block_count)),
        ("heads / KV heads", f"{info.head_count} / {info.head_count_kv_max}"),
        ("embedding", str(info.embedding_length)),
        ("vocabulary", f"{info.vocab_size:,}"),
        (
            "sliding window",
            f"{info.sliding_window} tokens on {sum(info.swa_layers)} of {info.block_count} layers"
            if info.sliding_window
            else "—",
        ),
        ("chat template", "yes" if info.has_chat_template else "no"),
        ("size", f"{mib(info.file_size_bytes)} MiB in {len(info.split_files)} file(s)"),
    ]
    for k, v in rows:
        table.add_row(k, escape(v))
    return table


def projector_table(p: ProjectorInfo, counted: bool) -> Table:
    from rich.table import Table  # start-up time: commands import what they use

    table = Table(
        title="projector (mmproj)", title_justify="left", show_header=False, box=None, pad_edge=False
    )
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("file", str(p.path)),
        ("type", f"{p.projector_type}, takes {' and '.join(p.modalities)}"),
        ("encoder", f"{p.block_count} layers, width {p.embedding_length}"),
        ("weights", f"{mib(p.weights_bytes)} MiB (+ {mib(p.compute_bytes)} MiB compute)"),
        (
            "in the estimate",
            "yes" if counted else 'no: serve it with mmproj = "auto" (or inspect --mmproj auto) to count it',
        ),
    ]
    if p.vision:
        rows.insert(2, ("image", f"{p.image_size} px, {p.patch_size} px patches"))
    for k, v in rows:
        table.add_row(k, escape(v))
    return table


def estimate_table(est: MemoryEstimate) -> Table:
    if est.parallel > 1:
        slots = f", {est.parallel} slots" + (" sharing one KV cache" if est.kv_unified else " of their own")
    else:
        slots = ", 1 slot"
    title = (
        f"estimate: ctx {est.ctx_size:,} (one request: up to {est.ctx_per_request:,} tokens){slots}, "
        f"KV {est.cache_type_k}/{est.cache_type_v}, "
        f"flash attention {'on' if est.flash_attn else 'off'}, {est.n_gpu_layers} layers on GPU"
        + (", embeddings" if est.embeddings else "")
    )
    from rich.table import Table  # start-up time: commands import what they use

    table = Table(title=title, title_justify="left", header_style="bold")
    proj = est.projector_bytes > 0
    ctx = est.context_bytes > 0  # the GPU backend's per-process context (none on the CPU)
    cols = ["device", "weights MiB", "KV MiB", "compute MiB", "output MiB"]
    cols += ["projector MiB"] if proj else []
    cols += ["device context MiB"] if ctx else []
    for col in [*cols, "total MiB"]:
        table.add_column(col, justify="right" if col != "device" else "left")
    for d in est.devices:
        parts = [d.weights_bytes, d.kv_bytes, d.compute_bytes, d.output_bytes]
        parts += [d.projector_bytes] if proj else []
        parts += [d.context_bytes] if ctx else []
        table.add_row(escape(d.device), *map(mib, parts), mib(d.total_bytes))
    parts = [est.weights_bytes, est.kv_bytes, est.compute_bytes, est.output_bytes]
    parts += [est.projector_bytes] if proj else []
    parts += [est.context_bytes] if ctx else []
    table.add_row("[bold]all[/]", *map(mib, parts), f"[bold]{mib(est.total_bytes)}[/]")
    return table
