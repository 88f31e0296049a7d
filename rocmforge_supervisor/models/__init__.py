"""Models: resolving a name to a GGUF file, inspecting it, estimating its memory, pulling from the hub.

Names are imported on first use (start-up time): the CLI's help names the embedded models
(``_catalog``) without importing gguf and numpy (``_gguf``, ``_estimate``) or huggingface-hub.
"""

from .._lazy import lazy_getattr

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._adapter import adapter_mismatch, check_adapter
    from ._allocations import REQUIRED_VERBOSITY, Allocation, AllocationLedger, parse_allocation_line
    from ._catalog import (
        BASE_MODEL,
        DEFAULT_MODEL,
        embedded_models,
        ensure_embedded,
        resolve_model_path,
        resolve_projector_path,
        unknown_name,
    )
    from ._draft import check_draft_vocab, declares_spec_type, vocab_mismatch
    from ._estimate import (
        DEVICE_CONTEXT_BYTES,
        DeviceEstimate,
        MemoryEstimate,
        backend_of,
        default_device_context,
        estimate_memory,
        kv_bytes_per_token,
    )
    from ._gguf import GGUFInfo, inspect_gguf
    from ._hub import (
        HubRef,
        PulledModel,
        parse_hf_reference,
        pull,
        pull_with_projector,
        resolve_hf_file,
        resolve_hf_reference,
    )
    from ._projector import ProjectorInfo, choose_projector, inspect_projector
    from ._whisper import WhisperLedgerFeed, inspect_whisper, whisper_state_bytes
    from ._whisper_ct2 import WHISPER_MODELS, fetch_whisper_model
else:  # mypy sees the imports above (and flags a name that is not there)
    __getattr__ = lazy_getattr(
        __name__,
        {
            "._allocations": (
                "REQUIRED_VERBOSITY",
                "Allocation",
                "AllocationLedger",
                "parse_allocation_line",
            ),
            "._catalog": (
                "BASE_MODEL",
                "DEFAULT_MODEL",
                "choose_projector",
                "embedded_models",
                "ensure_embedded",
                "resolve_model_path",
                "resolve_projector_path",
                "unknown_name",
            ),
            "._estimate": (
                "DEVICE_CONTEXT_BYTES",
                "DeviceEstimate",
                "MemoryEstimate",
                "backend_of",
                "default_device_context",
                "estimate_memory",
                "kv_bytes_per_token",
            ),
            "._adapter": ("adapter_mismatch", "check_adapter"),
            "._draft": ("check_draft_vocab", "declares_spec_type", "vocab_mismatch"),
            "._gguf": ("GGUFInfo", "inspect_gguf"),
            "._hub": (
                "HubRef",
                "PulledModel",
                "parse_hf_reference",
                "pull",
                "pull_with_projector",
                "pull_with_projector",
                "resolve_hf_file",
                "resolve_hf_reference",
            ),
            "._projector": ("ProjectorInfo", "choose_projector", "inspect_projector"),
            "._whisper": ("WhisperLedgerFeed", "inspect_whisper", "whisper_state_bytes"),
            "._whisper_ct2": ("WHISPER_MODELS", "fetch_whisper_model"),
        },
    )

__all__ = [
    "BASE_MODEL",
    "DEFAULT_MODEL",
    "DEVICE_CONTEXT_BYTES",
    "REQUIRED_VERBOSITY",
    "WHISPER_MODELS",
    "Allocation",
    "AllocationLedger",
    "DeviceEstimate",
    "GGUFInfo",
    "HubRef",
    "MemoryEstimate",
    "ProjectorInfo",
    "PulledModel",
    "WhisperLedgerFeed",
    "adapter_mismatch",
    "backend_of",
    "check_adapter",
    "check_draft_vocab",
    "choose_projector",
    "declares_spec_type",
    "default_device_context",
    "embedded_models",
    "ensure_embedded",
    "estimate_memory",
    "fetch_whisper_model",
    "inspect_gguf",
    "inspect_projector",
    "inspect_whisper",
    "kv_bytes_per_token",
    "parse_allocation_line",
    "parse_hf_reference",
    "pull",
    "pull_with_projector",
    "resolve_hf_file",
    "resolve_hf_reference",
    "resolve_model_path",
    "resolve_projector_path",
    "unknown_name",
    "vocab_mismatch",
    "whisper_state_bytes",
]
