"""``forge serve`` (and ``--check-config``): a ``draft`` that cannot draft for its model is a
config error before the start, not a child that loads both and silently never drafts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import ConfigError, ForgeError

if TYPE_CHECKING:  # start-up time: `forge --help` imports no settings
    from ..config import ForgeConfig, ForgeSettings

__all__ = ["check_drafts"]


def _local(ref: str, settings: ForgeSettings) -> Path | None:
    """The file of a model reference when it is on disk; None for a hub one (checked at its load,
    after the download) or a path that does not exist yet (``_path_check.missing_model_files`` notes it)."""
    from ..models import embedded_models, ensure_embedded  # start-up time: only drafts need it

    path = Path(ref).expanduser()
    if path.is_file():
        return path
    if ref in embedded_models():
        try:
            return ensure_embedded(ref, settings)
        except ForgeError:
            return None
    return None


def check_drafts(cfg: ForgeConfig, settings: ForgeSettings) -> None:
    """Each model's ``draft`` against its vocabulary, where both files are local."""
    from ..models import check_draft_vocab, unknown_name

    place = f"config {cfg.source.name}: " if cfg.source is not None else "config: "
    for name, m in cfg.models.items():
        if m.draft is None:  # the config allows a draft on llama-server models only
            continue
        typo = unknown_name(m.draft)  # "smolm2-135m": never loadable, told with its "did you mean"
        if typo is not None:
            raise ConfigError(
                f"{place}models.{name}.draft: {typo.message}", key=f"models.{name}.draft", hint=typo.hint
            )
        model, draft = _local(m.path, settings), _local(m.draft, settings)
        if model is None or draft is None:
            continue
        try:
            check_draft_vocab(model, draft, key=f"models.{name}.draft")
        except ConfigError as exc:
            raise ConfigError(place + exc.message, key=exc.key, hint=exc.hint) from None
