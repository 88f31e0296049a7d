"""Finding or building llama-server from the pinned llama.cpp (HIP, CUDA, Vulkan or CPU)."""

from ._builder import BuildResult, build_llama_server, detected_gpu_targets
from ._locate import (
    BinaryInfo,
    ListedDevice,
    cached_builds,
    locate_llama_server,
    locate_rpc_server,
    parse_device_list,
    probe_binary,
)
from ._plan import BACKENDS, RPC_SERVER_TARGET, BuildPlan, cache_key, choose_backend, make_plan
from ._source import SourceTree, resolve_source

__all__ = [
    "BACKENDS",
    "RPC_SERVER_TARGET",
    "BinaryInfo",
    "BuildPlan",
    "BuildResult",
    "ListedDevice",
    "SourceTree",
    "build_llama_server",
    "cache_key",
    "cached_builds",
    "choose_backend",
    "detected_gpu_targets",
    "locate_llama_server",
    "locate_rpc_server",
    "make_plan",
    "parse_device_list",
    "probe_binary",
    "resolve_source",
]
