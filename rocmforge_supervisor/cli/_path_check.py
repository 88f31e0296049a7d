"""``forge serve`` (and ``--check-config``): each model's ``path`` before the start. A name that
can only be a misspelt embedded model is a config error; a local file that is not there yet is a
note (a volume may bring it before the first load)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import ConfigError

if TYPE_CHECKING:  # start-up time: `forge --help` imports no settings
    from ..config import ForgeConfig

__all__ = ["check_model_names", "missing_model_files"]


def check_model_names(cfg: ForgeConfig) -> None:
    """A ``path`` that can only be an embedded name and is none (``smolm2-135m``) is a config
    error, for ``--check-config`` and for ``serve`` alike: it can never load, and a typo is better
    told with its "did you mean" before the start than as a missing file at the first request."""
    from ..models import unknown_name  # start-up time: only serve needs the catalog
    from ..supervisor import backend_of

    bad = [
        (name, err)
        for name, m in cfg.models.items()
        if backend_of(m).reads_path and (err := unknown_name(m.path)) is not None
    ]
    if not bad:
        return
    first_name, first = bad[0]
    place = f"config {cfg.source.name}" if cfg.source is not None else "config"
    others = "; ".join(f"models.{n}.path: {e.message}" for n, e in bad[1:])
    more = f" (and {len(bad) - 1} more: {others})" if others else ""
    fix = f"fix the value in {cfg.source}: " if cfg.source is not None else ""
    raise ConfigError(
        f"{place}: models.{first_name}.path: {first.message}{more}",
        key=f"models.{first_name}.path",
        hint=fix + (first.hint or ""),
    )


def missing_model_files(cfg: ForgeConfig) -> list[str]:
    """Notes, not errors, for local paths that do not exist yet (a volume may bring them before
    the first load: a Kubernetes PVC) or hold no readable GGUF (a copy may still be under way):
    a typo or a cut download is better seen now than at the first request."""
    from .._errors import ForgeError
    from ..models import embedded_models, inspect_gguf  # start-up time: only --check-config
    from ..supervisor import backend_of

    notes = []
    for name, m in cfg.models.items():
        ref = m.path
        backend = backend_of(m)
        if not backend.reads_path:  # a command's ${MODEL}: whatever its server makes of it
            continue
        if ref in embedded_models() or ref.startswith("hf:"):
            continue
        path = Path(ref).expanduser()
        if not path.exists():
            notes.append(f"note: models.{name}: no file at {ref} yet (it must exist when the model loads)")
        elif backend.gguf and path.is_file():
            try:
                inspect_gguf(path)
            except ForgeError as exc:
                fix = f" — {exc.hint}" if exc.hint else ""
                notes.append(f"note: models.{name}: {exc.message} (it will not load as it is){fix}")
    return notes
