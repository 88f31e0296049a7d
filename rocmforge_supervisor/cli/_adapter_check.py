"""``forge serve`` (and ``--check-config``): a LoRA adapter made for another base model is a
config error before the start, not a child that dies while loading it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import ConfigError
from ._draft_check import _local

if TYPE_CHECKING:  # start-up time: `forge --help` imports no settings
    from ..config import ForgeConfig, ForgeSettings

__all__ = ["check_adapters"]


def check_adapters(cfg: ForgeConfig, settings: ForgeSettings) -> None:
    """Each model's ``[adapters.*]`` against the model, where both files are local (an ``hf:``
    one is checked at its load, after the download)."""
    from ..models import check_adapter

    place = f"config {cfg.source.name}: " if cfg.source is not None else "config: "
    for name, m in cfg.models.items():
        if not m.adapters:
            continue
        model = _local(m.path, settings)
        for adapter_name, adapter in m.adapters.items():
            key = f"models.{name}.adapters.{adapter_name}"
            path = Path(adapter.path).expanduser()
            if not adapter.path.startswith("hf:") and not path.is_file():
                raise ConfigError(
                    f"{place}{key}: {adapter.path} does not exist",
                    key=key,
                    hint="point path at the adapter's .gguf file",
                )
            if model is None or not path.is_file():
                continue
            try:
                check_adapter(model, path, key=key)
            except ConfigError as exc:
                raise ConfigError(place + exc.message, key=exc.key, hint=exc.hint) from None
