"""Settings: read once from the environment (``FORGE_*``), then passed down.

No other module reads environment variables for configuration; they take a :class:`ForgeSettings`.
(The child process environment is a different thing: :mod:`rocmforge_supervisor.process` builds it
from the parent's environment on purpose, and cleans it.)
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ForgeSettings", "get_settings"]


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    base = Path(value) if value and Path(value).is_absolute() else Path.home() / fallback
    return base / "rocmforge"


class ForgeSettings(BaseSettings):
    """Everything the package can be told through ``FORGE_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="FORGE_", extra="ignore", frozen=True)

    # -- where things live --------------------------------------------------------------------
    cache_dir: Path = Field(default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache"))
    """Builds, the unpacked llama.cpp sdist, assembled models."""
    state_dir: Path = Field(default_factory=lambda: _xdg("XDG_STATE_HOME", ".local/state"))
    """Per-instance logs, the service's pid/state file."""
    config_home: Path = Field(default_factory=lambda: _xdg("XDG_CONFIG_HOME", ".config"))
    """Where ``forge.toml`` is looked for before ``/etc/rocmforge``."""

    # -- llama-server --------------------------------------------------------------------------
    llama_server: Path | None = None
    """An explicit llama-server binary: wins over every cached build and PATH."""
    llama_cpp_source: Path | None = None
    """An explicit llama.cpp source tree for ``forge build``."""
    whisper_server: Path | None = None
    """An explicit whisper.cpp ``whisper-server`` binary (``backend = "whisper"`` models)."""
    gpu_targets: str | None = None
    """``GPU_TARGETS`` for a HIP build (``gfx1100;gfx1030``), instead of the detected targets."""
    selftest: bool = True
    """Serve one real completion with every new build and every located binary (once per path and
    mtime) before any model uses it. Off only where a binary cannot be run here at all."""

    # -- hardware ------------------------------------------------------------------------------
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    enable_igpu: bool = False
    """Integrated GPUs (APUs) are masked out unless this is set."""
    rocr_mask_by_uuid: bool = False
    """Also set ``ROCR_VISIBLE_DEVICES`` (by ``GPU-…`` UUID) on AMD children."""
    hsa_override_gfx_version: str | None = Field(
        default=None,
        validation_alias=AliasChoices("FORGE_HSA_OVERRIDE_GFX_VERSION", "HSA_OVERRIDE_GFX_VERSION"),
    )
    """The ROCm runtime's ``HSA_OVERRIDE_GFX_VERSION`` (e.g. ``11.0.0``): discovery honours it."""
    inherited_rocr_visible_devices: str | None = Field(
        default=None, validation_alias=AliasChoices("ROCR_VISIBLE_DEVICES")
    )
    """A ``ROCR_VISIBLE_DEVICES`` we were started under: HIP ordinals count after it."""
    inherited_cuda_visible_devices: str | None = Field(
        default=None, validation_alias=AliasChoices("CUDA_VISIBLE_DEVICES")
    )
    """A ``CUDA_VISIBLE_DEVICES`` we were started under: NVIDIA GPUs outside it are not used."""
    use_amdsmi: bool = True
    use_nvml: bool = True

    # -- systemd (set by the service manager, not by users) ------------------------------------
    notify_socket: str | None = Field(default=None, validation_alias=AliasChoices("NOTIFY_SOCKET"))
    """sd_notify socket (``/run/…`` or ``@abstract``) of a ``Type=notify`` unit."""
    watchdog_usec: int | None = Field(default=None, validation_alias=AliasChoices("WATCHDOG_USEC"))
    watchdog_pid: int | None = Field(default=None, validation_alias=AliasChoices("WATCHDOG_PID"))
    journal_stream: str | None = Field(default=None, validation_alias=AliasChoices("JOURNAL_STREAM"))
    """``<dev>:<inode>`` of stderr when it is connected to journald."""

    # -- models --------------------------------------------------------------------------------
    model_dirs: list[Path] = Field(default_factory=list)
    """Directories a model may be loaded from by path through the service API."""
    hf_cache_dir: Path | None = None
    """The Hugging Face hub cache to use; unset: huggingface-hub's own (``HF_HUB_CACHE``/``HF_HOME``)."""
    hf_offline: bool = False
    """Never reach huggingface.co (also on when huggingface-hub sees ``HF_HUB_OFFLINE=1``)."""
    hf_token: str | None = Field(default=None, repr=False)
    """A token for gated/private repos; unset: huggingface-hub's own (``HF_TOKEN``, ``hf auth login``)."""
    hf_endpoint: str | None = None
    """A Hugging Face mirror's URL; unset: huggingface-hub's own (``HF_ENDPOINT``, else huggingface.co)."""

    @property
    def builds_dir(self) -> Path:
        return self.cache_dir / "builds"

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"


@lru_cache(maxsize=1)
def get_settings() -> ForgeSettings:
    """The process-wide settings, read from the environment on first use."""
    return ForgeSettings()
