"""Finding or building llama-server from the pinned llama.cpp (HIP, CUDA, Vulkan or CPU).

Names are imported on first use (start-up time): ``forge --help`` needs only ``BACKENDS`` (from
the light ``_plan``), not the builder and locator with their settings, hardware and httpx imports.
"""

from .._lazy import lazy_getattr

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._builder import BuildResult, build_llama_server, detected_gpu_targets
    from ._locate import (
        BinaryInfo,
        ListedDevice,
        cached_builds,
        child_flags,
        locate_llama_server,
        locate_rpc_server,
        parse_device_list,
        probe_binary,
    )
    from ._plan import BACKENDS, RPC_SERVER_TARGET, BuildPlan, cache_key, choose_backend, make_plan
    from ._source import SourceTree, resolve_source
    from ._whisper import WhisperBuild, build_whisper_server, locate_whisper_server
else:  # mypy sees the imports above (and flags a name that is not there)
    __getattr__ = lazy_getattr(
        __name__,
        {
            "._builder": ("BuildResult", "build_llama_server", "detected_gpu_targets"),
            "._locate": (
                "BinaryInfo",
                "ListedDevice",
                "cached_builds",
                "child_flags",
                "locate_llama_server",
                "locate_rpc_server",
                "parse_device_list",
                "probe_binary",
            ),
            "._plan": (
                "BACKENDS",
                "RPC_SERVER_TARGET",
                "BuildPlan",
                "cache_key",
                "choose_backend",
                "make_plan",
            ),
            "._source": ("SourceTree", "resolve_source"),
            "._whisper": ("WhisperBuild", "build_whisper_server", "locate_whisper_server"),
        },
    )

__all__ = [
    "BACKENDS",
    "RPC_SERVER_TARGET",
    "BinaryInfo",
    "BuildPlan",
    "BuildResult",
    "ListedDevice",
    "SourceTree",
    "WhisperBuild",
    "build_llama_server",
    "build_whisper_server",
    "cache_key",
    "cached_builds",
    "child_flags",
    "choose_backend",
    "detected_gpu_targets",
    "locate_llama_server",
    "locate_rpc_server",
    "locate_whisper_server",
    "make_plan",
    "parse_device_list",
    "probe_binary",
    "resolve_source",
]
