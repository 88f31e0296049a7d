"""One llama-server child process: spawn, health, logs, stop."""

from ._env import clean_child_env
from ._groups import kill_process_group
from ._instance import LlamaServer
from ._ledger import ChildLedger
from ._logs import LogRing, classify_failure
from ._ports import free_port, port_is_free
from ._spec import InstanceSpec, InstanceState, describe_returncode, unwrap_group

__all__ = [
    "ChildLedger",
    "InstanceSpec",
    "InstanceState",
    "LlamaServer",
    "LogRing",
    "classify_failure",
    "clean_child_env",
    "describe_returncode",
    "free_port",
    "kill_process_group",
    "port_is_free",
    "unwrap_group",
]
