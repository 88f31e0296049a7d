"""Configuration, at the bottom of the package: everything above takes these typed values.

Two sources, one package:

- :class:`ForgeSettings` (``_settings``): process-wide knobs from ``FORGE_*`` variables (where
  caches, state and the llama-server binary live; hardware switches; systemd's variables).
- :class:`ForgeConfig` (``_schema``): ``forge serve``'s ``forge.toml``, overridden by
  ``FORGE_<SECTION>__<KEY>`` variables, built by :func:`load_config` (``_file``) with the
  settings; ``_explain`` turns every invalid value into one line naming its key.

Two knobs exist in both, on purpose (one is per-process, one per service config), and are resolved
in ONE place, :class:`ForgeConfig`:

- ``FORGE_STATE_DIR`` is the default; ``server.state_dir`` (or ``FORGE_SERVER__STATE_DIR``) wins
  for ``forge serve`` (:attr:`ForgeConfig.state_dir`).
- ``FORGE_MODEL_DIRS`` and ``server.model_dirs`` (``FORGE_SERVER__MODEL_DIRS``) add up
  (:attr:`ForgeConfig.model_dirs`).

The GPU choice and the layer count have one type and one parser each (``_values``).

Names are imported on first use (start-up time): ``forge gpus`` needs the settings but not the
``forge.toml`` schema, and the GPU-option parsers need neither pydantic nor pydantic-settings.
"""

from .._lazy import lazy_getattr

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._command_keys import CommandKeys
    from ._file import CONF_D, CONFIG_NAME, SYSTEM_CONFIG_DIR, config_files, config_search_path, load_config
    from ._llama_keys import LlamaKeys
    from ._names import MODEL_NAME, is_loopback
    from ._peers import PeerApi, PeerConfig, PeerTimeouts
    from ._schema import (
        AdapterConfig,
        ForgeConfig,
        GroupConfig,
        KeyConfig,
        ModelConfig,
        ServerConfig,
        SupervisorConfig,
        VariantConfig,
        WorkerConfig,
    )
    from ._settings import ForgeSettings, get_settings
    from ._values import (
        CtxSize,
        GpuChoice,
        GpuLayers,
        GpuRef,
        gpu_layers_for_placement,
        parse_ctx_size,
        parse_gpu,
        parse_gpu_layers,
    )
    from ._variants import unknown_served_name
else:  # mypy sees the imports above (and flags a name that is not there)
    __getattr__ = lazy_getattr(
        __name__,
        {
            "._command_keys": ("CommandKeys",),
            "._llama_keys": ("LlamaKeys",),
            "._file": (
                "CONFIG_NAME",
                "CONF_D",
                "SYSTEM_CONFIG_DIR",
                "config_files",
                "config_search_path",
                "load_config",
            ),
            "._names": ("MODEL_NAME", "is_loopback"),
            "._peers": ("PeerApi", "PeerConfig", "PeerTimeouts"),
            "._schema": (
                "AdapterConfig",
                "ForgeConfig",
                "GroupConfig",
                "KeyConfig",
                "ModelConfig",
                "ServerConfig",
                "SupervisorConfig",
                "VariantConfig",
                "WorkerConfig",
            ),
            "._settings": ("ForgeSettings", "get_settings"),
            "._values": (
                "CtxSize",
                "GpuChoice",
                "GpuLayers",
                "GpuRef",
                "gpu_layers_for_placement",
                "parse_ctx_size",
                "parse_gpu",
                "parse_gpu_layers",
            ),
            "._variants": ("unknown_served_name",),
        },
    )

__all__ = [
    "CONFIG_NAME",
    "CONF_D",
    "MODEL_NAME",
    "SYSTEM_CONFIG_DIR",
    "AdapterConfig",
    "CommandKeys",
    "CtxSize",
    "ForgeConfig",
    "ForgeSettings",
    "GpuChoice",
    "GpuLayers",
    "GpuRef",
    "GroupConfig",
    "KeyConfig",
    "LlamaKeys",
    "ModelConfig",
    "PeerApi",
    "PeerConfig",
    "PeerTimeouts",
    "ServerConfig",
    "SupervisorConfig",
    "VariantConfig",
    "WorkerConfig",
    "config_files",
    "config_search_path",
    "get_settings",
    "gpu_layers_for_placement",
    "is_loopback",
    "load_config",
    "parse_ctx_size",
    "parse_gpu",
    "parse_gpu_layers",
    "unknown_served_name",
]
