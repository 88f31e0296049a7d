"""The server processes forge owns: one lifecycle (spawn, logs, readiness, stop, restart policy),
llama-server and rpc-server on top of it; another model server's kind and program are its
backend's (``supervisor/backends/``), on the same lifecycle."""

from ._child import ChildKind, ChildProcess, HttpOk, LogLine, Readiness
from ._env import clean_child_env
from ._groups import GroupReaper, kill_process_group, stop_process_group
from ._instance import LlamaServer, ModelServer
from ._ledger import ChildLedger
from ._logs import IDLE_LINE_RE, LogRing, classify_failure, crash_cause, without_idle
from ._model_kind import ModelServerKind
from ._ports import free_port, port_is_free
from ._probe import ProbeRun, probe_server
from ._programs import LLAMA_SERVER, WHISPER_SERVER, KnownServer, ServerProgram, SpecFields
from ._restart import Breaker, ChildEvent, Life, Outcome, RestartPolicy, restart_loop
from ._rpc_worker import RpcWorker, WorkerEvent, WorkerSpec, is_loopback_host, run_supervised, worker_specs
from ._sdnotify import SdNotifier
from ._spawn import with_parent_death
from ._spec import InstanceSpec, InstanceState, crash_advice, describe_returncode, unwrap_group
from ._statelock import StateDirLock

__all__ = [
    "IDLE_LINE_RE",
    "LLAMA_SERVER",
    "WHISPER_SERVER",
    "Breaker",
    "ChildEvent",
    "ChildKind",
    "ChildLedger",
    "ChildProcess",
    "GroupReaper",
    "HttpOk",
    "InstanceSpec",
    "InstanceState",
    "KnownServer",
    "Life",
    "LlamaServer",
    "LogLine",
    "LogRing",
    "ModelServer",
    "ModelServerKind",
    "Outcome",
    "ProbeRun",
    "Readiness",
    "RestartPolicy",
    "RpcWorker",
    "SdNotifier",
    "ServerProgram",
    "SpecFields",
    "StateDirLock",
    "WorkerEvent",
    "WorkerSpec",
    "classify_failure",
    "clean_child_env",
    "crash_advice",
    "crash_cause",
    "describe_returncode",
    "free_port",
    "is_loopback_host",
    "kill_process_group",
    "port_is_free",
    "probe_server",
    "restart_loop",
    "run_supervised",
    "stop_process_group",
    "unwrap_group",
    "with_parent_death",
    "without_idle",
    "worker_specs",
]
