"""Finding or building the programs forge runs (llama-server, whisper-server) for an accel (HIP,
CUDA, Vulkan or CPU): one :class:`Recipe` per program in ``RECIPES``, the steps written once.

Names are imported on first use (start-up time): ``forge --help`` needs only ``ACCELS`` (from
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
        selftest_of,
    )
    from ._plan import (
        ACCELS,
        RPC_SERVER_TARGET,
        Accel,
        BuildPlan,
        cache_key,
        check_accel,
        choose_accel,
        make_plan,
    )
    from ._recipe import RECIPES, Recipe
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
                "selftest_of",
            ),
            "._plan": (
                "ACCELS",
                "RPC_SERVER_TARGET",
                "Accel",
                "BuildPlan",
                "cache_key",
                "check_accel",
                "choose_accel",
                "make_plan",
            ),
            "._recipe": ("RECIPES", "Recipe"),
            "._source": ("SourceTree", "resolve_source"),
            "._whisper": ("WhisperBuild", "build_whisper_server", "locate_whisper_server"),
        },
    )

__all__ = [
    "ACCELS",
    "RECIPES",
    "RPC_SERVER_TARGET",
    "Accel",
    "BinaryInfo",
    "BuildPlan",
    "BuildResult",
    "ListedDevice",
    "Recipe",
    "SourceTree",
    "WhisperBuild",
    "build_llama_server",
    "build_whisper_server",
    "cache_key",
    "cached_builds",
    "check_accel",
    "child_flags",
    "choose_accel",
    "detected_gpu_targets",
    "locate_llama_server",
    "locate_rpc_server",
    "locate_whisper_server",
    "make_plan",
    "parse_device_list",
    "probe_binary",
    "resolve_source",
    "selftest_of",
]
