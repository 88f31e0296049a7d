"""The supervisor behind ``forge serve``: a registry of managed models in one task group.

It owns every child (through :class:`~.._managed.ManagedModel`), decides placement before each
start, and answers the HTTP layer's questions (acquire a model, load, unload, reload, status). It
never formats HTTP: errors cross as typed exceptions.

No orphans, in three layers: children die with us (parent-death signal); a clean stop drains and
stops them all (shielded from cancellation); and at start, children recorded by a previous run
that are still alive (checked by pid, start time and command line) are stopped.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import psutil

from .._errors import ModelNotFound, PlacementError, ServiceError, UsageError
from ..client._transport import Upstream
from ..process import InstanceSpec
from ..settings import ForgeSettings
from ._events import EventBus
from ._loading import wait_ready_within
from ._managed import ManagedModel, ModelRetired, ModelState, Prepared, SupervisionPolicy

__all__ = ["Supervisor"]

log = logging.getLogger("rocmforge.supervisor")


def _policy(cfg: Any) -> SupervisionPolicy:
    if cfg is None:
        return SupervisionPolicy()
    fields = SupervisionPolicy.__dataclass_fields__
    return SupervisionPolicy(**{k: getattr(cfg, k) for k in fields if hasattr(cfg, k)})


class Supervisor:
    def __init__(self, config: Any, settings: ForgeSettings, *, binary: Path | None = None) -> None:
        self.config = config
        self.settings = settings
        self.binary = binary
        self.events = EventBus()
        self.log_bus = EventBus(history=0, buffer=1024)  # child log lines, for `forge logs -f`
        self.policy = _policy(getattr(config, "supervisor", None))
        self.models: dict[str, ManagedModel] = {}
        self.ready = anyio.Event()
        self.started_at = time.time()
        self.inventory: Any = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._placement_lock = anyio.Lock()
        self._reload_lock = anyio.Lock()
        self.state_dir: Path = config.state_dir
        self.log_dir: Path = config.log_dir
        for name, mc in config.models.items():
            self.models[name] = self._new_model(name, mc)

    # -- construction --------------------------------------------------------------------------

    def _new_model(self, name: str, mc: Any, config: Any = None) -> ManagedModel:
        cfg = config or self.config
        fp = cfg.model_fingerprint(name) if name in getattr(cfg, "models", {}) else ""
        m = ManagedModel(
            name, mc, policy=self.policy, events=self.events, prepare=self._prepare, fingerprint=fp
        )
        m.on_ready.append(lambda _m: self._record_children())
        return m

    # -- life ----------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[Supervisor] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; then drain and stop every child (shielded)."""
        from ..build import locate_llama_server
        from ..hardware import detect

        if self.binary is None:
            # With [[workers]] the children need --rpc: only an RPC build (`forge build --rpc`) has it.
            rpc = bool(getattr(self.config, "workers", None))
            found = await anyio.to_thread.run_sync(lambda: locate_llama_server(self.settings, rpc=rpc))
            self.binary = found.path
        self.inventory = await anyio.to_thread.run_sync(detect, self.settings)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.reap_stale_children()
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                preload = [m for m in self.models.values() if getattr(m.config, "preload", False)]
                for m in preload:
                    m.start_in(tg)
                task_status.started(self)
                for m in preload:
                    await self._settled(m)
                self.ready.set()
                self.events.publish("*", "ready", preloaded=[m.name for m in preload])
                await anyio.sleep_forever()
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                await self.stop_all()

    async def _settled(self, m: ManagedModel) -> None:
        while m.state not in (ModelState.READY, ModelState.FAILED, ModelState.STOPPED):
            await m._changed.wait()

    async def stop_all(self) -> None:
        """Drain and stop every model at once (bounded by drain + stop timeouts)."""
        async with anyio.create_task_group() as tg:
            for m in list(self.models.values()):
                tg.start_soon(m.unload, "shutdown")
        self._record_children()

    def _start(self, m: ManagedModel) -> None:
        if self._tg is None:
            raise UsageError("the supervisor is not running", hint="start it with `forge serve`")
        m.start_in(self._tg)

    # -- requests ------------------------------------------------------------------------------

    def get(self, name: str) -> ManagedModel:
        try:
            return self.models[name]
        except KeyError:
            known = ", ".join(sorted(self.models)) or "none configured"
            raise ModelNotFound(f"model {name!r} is not configured", hint=f"known models: {known}") from None

    def load_wait(self, name: str) -> float:
        """Seconds a request waits for a loading model before a 503: the model's, else the server's."""
        mc = self.get(name).config
        own = getattr(mc, "load_wait", None)
        if own is not None:
            return float(own)
        return float(getattr(getattr(self.config, "server", None), "load_wait", 30.0))

    @asynccontextmanager
    async def acquire(self, name: str, *, load_wait: float | None = None) -> AsyncIterator[Upstream]:
        """A slot at the model's child for one request, as an :class:`Upstream` (URL, key,
        liveness): the HTTP layer gets where to send, not the process. ``load_wait`` bounds the
        wait for a load (then :class:`ModelLoading`); None waits as long as the load takes."""
        for _ in range(3):
            m = self.get(name)  # looked up again after a reload replaced the model
            try:
                ctx = m.acquire(self._start, load_wait)
                server = await ctx.__aenter__()
            except ModelRetired:
                continue
            try:
                # The loop ends at this yield (return below), so `server` is never rebound.
                yield Upstream(server.base_url, server.api_key, is_alive=lambda: server.alive)  # noqa: B023
            except BaseException as exc:
                if not await ctx.__aexit__(type(exc), exc, exc.__traceback__):
                    raise
            else:
                await ctx.__aexit__(None, None, None)
            return
        raise ServiceError(f"model {name!r} is being reconfigured", hint="retry in a moment")

    async def wait_loaded(self, name: str, *, load_wait: float | None) -> None:
        """Start the model if needed and wait until it is ready, at most ``load_wait`` seconds
        (then :class:`ModelLoading`; the load goes on in the supervisor's task group)."""
        for _ in range(3):
            try:
                await wait_ready_within(self.get(name), self._start, load_wait)
                return
            except ModelRetired:
                continue
        raise ServiceError(f"model {name!r} is being reconfigured", hint="retry in a moment")

    async def load(self, name: str) -> dict[str, Any]:
        """Load (and wait until ready). Resets a failed model's breaker."""
        m = self.get(name)
        m.reset()
        await m.wait_ready(self._start)
        return m.status()

    async def unload(self, name: str) -> dict[str, Any]:
        m = self.get(name)
        await m.unload()
        self._record_children()
        return m.status()

    def status(self) -> list[dict[str, Any]]:
        return [m.status() for m in self.models.values()]

    async def add_model(self, name: str, path: Path) -> dict[str, Any]:
        """Register a model by path (the HTTP layer checked it is under model_dirs) and load it."""
        if name in self.models:
            raise UsageError(
                f"a model named {name!r} already exists", hint="choose another name, or unload it"
            )
        from ..service._config import ModelConfig

        m = self._new_model(name, ModelConfig(path=str(path)))
        self.models[name] = m
        return await self.load(name)

    # -- reload ----------------------------------------------------------------------------------

    async def reload(self, new_config: Any) -> dict[str, list[str]]:
        """Apply a new config: unchanged models keep running (limits updated in place); changed
        ones are replaced start-new-first; removed ones are drained; added ones registered."""
        async with self._reload_lock:
            self.config = new_config
            self.policy = _policy(getattr(new_config, "supervisor", None))
            summary: dict[str, list[str]] = {
                "unchanged": [],
                "changed": [],
                "added": [],
                "removed": [],
                "failed": [],
            }
            old_names, new_names = set(self.models), set(new_config.models)
            for name in sorted(old_names - new_names):
                summary["removed"].append(name)
                m = self.models.pop(name)
                m.retired = True
                self._spawn(m.unload, "removed")
            for name in sorted(new_names - old_names):
                summary["added"].append(name)
                m = self._new_model(name, new_config.models[name], new_config)
                self.models[name] = m
                if getattr(m.config, "preload", False):
                    self._start(m)
            for name in sorted(old_names & new_names):
                old = self.models[name]
                fp = new_config.model_fingerprint(name)
                if fp == old.fingerprint:
                    summary["unchanged"].append(name)
                    old.update_limits(new_config.models[name])
                    old.policy = self.policy
                    if old.state == ModelState.FAILED:
                        old.reset()
                    continue
                summary["changed"].append(name)
                if not await self._replace(old, self._new_model(name, new_config.models[name], new_config)):
                    summary["failed"].append(name)
            self.events.publish("*", "config", changes=summary)
            return summary

    async def _replace(self, old: ManagedModel, new: ManagedModel) -> bool:
        """Start-new-first. False when the new config does not come up and the old one stays."""
        if not old.running:
            old.retired = True
            self.models[new.name] = new
            if getattr(new.config, "preload", False):
                self._start(new)
            return True
        # Start the replacement first; the old one serves until the new one is ready.
        self._start(new)
        while new.state not in (ModelState.READY, ModelState.FAILED, ModelState.STOPPED):
            await new._changed.wait()
        if new.state == ModelState.READY:
            self.models[new.name] = new
            old.retired = True
            self._spawn(old.unload, "replaced")
            return True
        if new.failure_kind not in ("placement", "oom", "timeout"):
            # The new config itself is broken (bad file, bad args…): keep the working one.
            log.error("model %s: the new config failed (%s); the running one stays", new.name, new.last_error)
            new.retired = True
            self._spawn(new.unload, "failed replacement")
            return False
        # It did not fit next to the old one: stop the old one first, then start the new one.
        log.warning("model %s: no room next to the old one (%s); swapping", new.name, new.last_error)
        old.retired = True
        await old.unload("replaced")
        self.models[new.name] = new
        new.reset()
        self._start(new)
        return True

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._tg is not None:
            self._tg.start_soon(fn, *args)

    # -- placement and spawn spec -----------------------------------------------------------------

    async def _prepare(self, m: ManagedModel) -> Prepared:
        from ..hardware import child_env, refresh_usage
        from ..models import resolve_model_path
        from ..models._gguf import inspect_gguf
        from ..models._templates import fallback_chat_template_args
        from ._placement import await_release
        from ._placement_glue import (
            CHILD_VERBOSITY,
            decide_for_service,
            free_by_device,
            new_allocation_tracker,
        )
        from ._workers_glue import uses_workers

        mc = m.config
        path = await anyio.to_thread.run_sync(resolve_model_path, str(mc.path), self.settings)
        info = await anyio.to_thread.run_sync(inspect_gguf, path)
        async with self._placement_lock:
            inventory = await anyio.to_thread.run_sync(refresh_usage, self.inventory, self.settings)
            self.inventory = inventory
            mode = uses_workers(self.config, mc)
            try:
                decision = (
                    None
                    if mode in ("only", "all")
                    else decide_for_service(m, info, inventory, self.settings, self.models.values())
                )
            except PlacementError:
                if mode == "never":
                    raise
                decision = None
            if decision is None:  # it does not fit here (or must not): all layers on RPC workers
                return await self._prepare_on_workers(m, path, info, inventory)
            for victim in decision.evict:
                other = self.models.get(victim)
                if other is not None:
                    self.events.publish(victim, "evict", for_model=m.name)
                    await other.unload("evicted")
            if decision.evict:
                # Drivers hand VRAM back a moment after the process exits: wait (bounded) for it.
                def read_free() -> Any:
                    self.inventory = refresh_usage(self.inventory, self.settings)
                    return free_by_device(self.inventory)

                await await_release(read_free, decision.need_bytes)
                inventory = self.inventory
        devices = [inventory.by_key(k) for k in decision.devices]

        user_args = list(getattr(mc, "args", []) or [])
        extra = [*fallback_chat_template_args(info, user_args), *user_args]
        if decision.tensor_split and len(decision.devices) > 1:
            extra += ["--tensor-split", ",".join(f"{x:g}" for x in decision.tensor_split)]
        tracker = new_allocation_tracker(decision.devices)
        ngl = getattr(mc, "gpu_layers", None)
        spec = InstanceSpec(
            binary=self.binary or Path("llama-server"),
            model_path=path,
            alias=m.name,
            ctx_size=getattr(mc, "ctx_size", None) or decision.ctx_size,
            n_gpu_layers=decision.n_gpu_layers if ngl in (None, "auto") else ngl,
            parallel=getattr(mc, "parallel", None) or decision.parallel,
            extra_args=extra,
            mask=child_env(devices, inventory, self.settings),
            cpu_only=all(d.vendor == "cpu" for d in devices),
            log_path=self.log_dir / f"{m.name}.log",
            state_dir=self.state_dir,
            stall_timeout=self.policy.load_stall_timeout,
            ready_timeout=self.policy.load_deadline(info.file_size_bytes),
            stop_timeout=self.policy.stop_timeout,
            verbosity=CHILD_VERBOSITY,
            line_listeners=[tracker.feed, self._log_forwarder(m.name)],
        )
        return Prepared(
            spec=spec,
            devices=list(decision.devices),
            estimated_bytes=decision.estimated_bytes,
            actual=tracker,
        )

    async def _prepare_on_workers(self, m: ManagedModel, path: Path, info: Any, inventory: Any) -> Prepared:
        from ..models._templates import fallback_chat_template_args
        from ._workers_glue import prepare_on_workers

        user_args = list(getattr(m.config, "args", []) or [])
        return await prepare_on_workers(
            m,
            path,
            info,
            config=self.config,
            settings=self.settings,
            binary=self.binary or Path("llama-server"),
            inventory=inventory,
            models=self.models.values(),
            policy=self.policy,
            log_dir=self.log_dir,
            state_dir=self.state_dir,
            extra_args=[*fallback_chat_template_args(info, user_args), *user_args],
            listeners=[self._log_forwarder(m.name)],
        )

    def _log_forwarder(self, name: str) -> Callable[[str], None]:
        def forward(line: str) -> None:
            self.log_bus.publish(name, "log", line=line)

        return forward

    # -- children bookkeeping (for the stale-child sweep of the next run) ----------------------------

    @property
    def children_file(self) -> Path:
        return self.state_dir / "children.json"

    def _record_children(self) -> None:
        records = []
        for m in self.models.values():
            s = m.server
            if s is not None and s.alive and s.pid is not None:
                try:
                    ct = psutil.Process(s.pid).create_time()
                except psutil.Error:
                    continue
                records.append({"pid": s.pid, "create_time": ct, "model": m.name, "supervisor": os.getpid()})
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.state_dir, prefix=".children-")
            with os.fdopen(fd, "w") as f:
                json.dump(records, f)
            Path(tmp).replace(self.children_file)
        except OSError as exc:
            log.warning("could not record children in %s: %s", self.children_file, exc)

    def reap_stale_children(self) -> list[int]:
        """Stop llama-server children that a previous run recorded and that still run."""
        try:
            records = json.loads(self.children_file.read_text())
        except (OSError, ValueError):
            return []
        stopped: list[int] = []
        procs = []
        for r in records if isinstance(records, list) else []:
            try:
                p = psutil.Process(int(r["pid"]))
                if abs(p.create_time() - float(r["create_time"])) > 0.5:
                    continue  # the pid was reused by something else
                if not any("llama-server" in part for part in p.cmdline()[:4]):
                    continue
                owner = int(r.get("supervisor", 0))
                if owner == os.getpid() or (owner and psutil.pid_exists(owner) and _is_forge(owner)):
                    continue  # ours, or another live forge serve's on the same state dir
            except (psutil.Error, KeyError, ValueError, TypeError):
                continue
            log.warning(
                "stopping stale llama-server pid %d (model %s) left by a previous run", p.pid, r.get("model")
            )
            p.terminate()
            procs.append(p)
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:
            p.kill()
        stopped = [p.pid for p in procs]
        self.children_file.unlink(missing_ok=True)
        return stopped


def _is_forge(pid: int) -> bool:
    try:
        return any(
            "rocmforge" in part or "forge" in Path(part).name for part in psutil.Process(pid).cmdline()[:4]
        )
    except psutil.Error:
        return False
