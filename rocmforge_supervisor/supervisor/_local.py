"""``load_model`` / ``aload_model``: one model in a child of this Python process.

The in-process use of the launch pipeline (:mod:`._launch`): resolve the model, check it is a
GGUF before spawning, find llama-server, place it on devices, spawn it with the right mask, and
hand back a TextModel that owns the child (closing the model stops the child).

The synchronous API runs the async core on a private event-loop thread per model. That thread is a
daemon: a program that forgets ``close()`` still exits (a ``weakref.finalize`` hook stops the
child gracefully, and the child's parent-death signal covers everything else).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal

from .._errors import InstanceError, ModelCrashed, UsageError
from ..binaries import locate_llama_server
from ..client import TextModel
from ..config import ForgeSettings, GpuChoice, GpuLayers, get_settings, parse_gpu, parse_gpu_layers
from ..hardware import detect
from ..models import embedded_models
from ..process import ModelServer, describe_returncode, unwrap_group
from .launch._launch import LaunchPlan, ModelSpec, build_plan, decide, resolve
from .placement._device_context import CONTEXT_FILE, DeviceContexts

__all__ = ["LoadOptions", "aload_model", "load_model", "plan_local_load"]


@dataclass(frozen=True)
class LoadOptions:
    """``load_model``'s keyword options: the model spec's knobs plus how to run this one child."""

    ctx_size: int | None = None
    n_gpu_layers: GpuLayers | str = None
    parallel: int | None = None
    kv_unified: bool | None = None
    """False: each slot its own ``ctx_size / parallel`` (as ``[models.NAME] kv_unified``)."""
    gpu: GpuChoice | Sequence[int | str] = "auto"
    port: int | None = None
    api_key: str | None = None  # None: a new random one; "": none (the child binds loopback only)
    alias: str | None = None
    args: Sequence[str] = ()
    stall_timeout: float = 300.0
    ready_timeout: float | None = None
    stop_timeout: float = 10.0
    log_path: Path | None = None
    verbosity: int | None = None
    mmproj: str | None = None
    """A multimodal projector: a path, ``hf:org/repo:FILE`` or ``auto`` (as ``[models.NAME] mmproj``)."""
    mmproj_offload: bool | None = None

    def model_spec(self, model: str | Path) -> ModelSpec:
        """The spec, validated with the same parsers as forge.toml; UsageError on a bad value."""
        if self.ctx_size is not None and self.ctx_size < 0:
            raise UsageError(f"ctx_size must be >= 0, got {self.ctx_size}", hint="use 0 for the model's own")
        if self.parallel is not None and self.parallel < 1:
            raise UsageError(f"parallel must be >= 1, got {self.parallel}", hint="use 1 or more slots")
        if self.port is not None and not 0 < self.port < 65536:
            raise UsageError(f"port {self.port} is out of range", hint="use 1-65535, or leave it unset")
        try:
            ngl = parse_gpu_layers(self.n_gpu_layers)
        except ValueError as exc:
            raise UsageError(f"n_gpu_layers: {exc}", hint="e.g. 99, auto, all") from None
        try:
            gpu = parse_gpu(self.gpu)
        except ValueError as exc:
            raise UsageError(f"gpu: {exc}", hint="e.g. gpu='auto', gpu=0, gpu=[0, 1]") from None
        return ModelSpec(
            path=str(model),
            ctx_size=self.ctx_size,
            n_gpu_layers=ngl,
            parallel=self.parallel,
            kv_unified=self.kv_unified,
            gpu=gpu,
            args=tuple(self.args),
            mmproj=self.mmproj or None,
            mmproj_offload=self.mmproj_offload,
        )


def plan_local_load(model: str | Path, options: LoadOptions, settings: ForgeSettings) -> LaunchPlan:
    """Resolve, validate and place; touches no process. Raises a ForgeError on bad input."""
    spec = options.model_spec(model)
    resolved = resolve(spec, settings)  # bad magic / truncated / wrong version: refused before any spawn
    found = locate_llama_server(settings)
    inventory = detect(settings)
    # An embedded model is known by its short name (what `forge chat`/the service call it).
    alias = options.alias or (str(model) if str(model) in embedded_models() else resolved.path.stem)
    contexts = DeviceContexts(settings.cache_dir / CONTEXT_FILE).for_devices(inventory.devices)
    decision = decide(spec, alias, resolved, inventory, binary_args=found.child_args, device_context=contexts)
    return build_plan(
        spec,
        alias,
        resolved,
        decision,
        inventory,
        settings,
        binary=found.path,
        binary_args=found.child_args,
        # Not the service's ``NAME.log``: ``forge logs NAME`` must show the service's child alone.
        log_path=options.log_path or settings.logs_dir / f"load-{alias.replace('/', '_')}.log",
        state_dir=settings.state_dir,
        port=options.port,
        api_key=options.api_key,
        stall_timeout=options.stall_timeout,
        ready_timeout=options.ready_timeout,
        stop_timeout=options.stop_timeout,
        verbosity=options.verbosity,
    )


class _ServerLiveness:
    """Lets the client ask "did the child die?" without knowing what a process is."""

    def __init__(self, server: ModelServer) -> None:
        self._server = server

    @property
    def pid(self) -> int | None:
        return self._server.pid

    def _crash(self) -> InstanceError | None:
        s = self._server
        if not s.exited.is_set():
            return None
        return ModelCrashed(
            f"llama-server for {s.spec.alias!r} (pid {s.pid}) {describe_returncode(s.returncode)}",
            hint="see its log" + (f": {s.spec.log_path}" if s.spec.log_path else ""),
            returncode=s.returncode,
            reason="crashed",
            stderr_tail=s.log.tail(10),
            log_path=str(s.spec.log_path) if s.spec.log_path else None,
        )

    def crashed(self, wait: float) -> InstanceError | None:
        # Called from the caller's thread in sync mode: reading the flag is safe; poll briefly.
        deadline = time.monotonic() + wait
        while not self._server.exited.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._crash()

    async def acrashed(self, wait: float) -> InstanceError | None:
        if wait > 0:
            with anyio.move_on_after(wait):
                await self._server.exited.wait()
        return self._crash()


class LocalModel(TextModel):
    """A TextModel backed by a child we own; ``server`` exposes the child (pid, port, log)."""

    server: ModelServer
    plan: LaunchPlan
    _loop: _LoopThread | None = None

    def wait_exit(self) -> int | None:
        """Block until the child exits (sync models only); returns its exit status."""
        if self._loop is None:
            raise RuntimeError(
                "wait_exit() is for models from load_model(); await model.server.exited.wait()"
            )
        self._loop.portal.call(self.server.exited.wait)
        return self.server.returncode


async def aload_model(model: str | Path, *, settings: ForgeSettings | None = None, **kw: Any) -> LocalModel:
    """Spawn llama-server for ``model`` and wait until it is ready (async).

    Close the result in the task that created it (``async with await aload_model(...) as m``):
    the child's watcher tasks belong to that task.
    """
    settings = settings or get_settings()
    options = LoadOptions(**kw)
    # Resolving may download (hf:), inspecting reads the GGUF: not on the event loop.
    plan = await anyio.to_thread.run_sync(plan_local_load, model, options, settings)
    server = ModelServer(plan.spec)
    await server.__aenter__()
    tm = LocalModel(
        server.base_url,
        model=plan.spec.alias,
        api_key=server.api_key,
        liveness=_ServerLiveness(server),
        on_aclose=server.aclose,
    )
    tm.server = server
    tm.plan = plan
    return tm


class _LoopThread:
    """A daemon thread running an event loop, reachable through a BlockingPortal."""

    def __init__(self, name: str) -> None:
        handoff: queue.Queue[BlockingPortal | BaseException] = queue.Queue()

        async def main() -> None:
            try:
                async with BlockingPortal() as portal:
                    handoff.put(portal)
                    await portal.sleep_until_stopped()
            except BaseException as exc:
                handoff.put(exc)
                raise

        self.thread = threading.Thread(target=anyio.run, args=(main,), daemon=True, name=name)
        self.thread.start()
        got = handoff.get()
        if isinstance(got, BaseException):
            raise got
        self.portal = got

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):  # already stopped
            self.portal.call(self.portal.stop, True)
        self.thread.join(timeout=30)


def load_model(model: str | Path, *, settings: ForgeSettings | None = None, **kw: Any) -> LocalModel:
    """Spawn llama-server for ``model`` and wait until it is ready; the result stops it on close.

    Keyword options: see :class:`LoadOptions` (ctx_size, n_gpu_layers, parallel, gpu, port, alias,
    args, stall_timeout, ready_timeout, stop_timeout, log_path).
    """
    settings = settings or get_settings()
    plan = plan_local_load(model, LoadOptions(**kw), settings)
    loop = _LoopThread(name=f"forge-{plan.spec.alias}")
    server = ModelServer(plan.spec)
    try:
        # run() is the child's whole life in one task on the loop thread; start_task returns once
        # it is ready, or raises its start failure.
        run_future, _ = loop.portal.start_task(server.run, name=f"llama-server {plan.spec.alias}")
    except BaseException as exc:
        # Ctrl-C or a failed start: stopping the loop cancels run(), whose cleanup is shielded.
        loop.stop()
        raise unwrap_group(exc) from None

    closed = threading.Event()

    def on_close() -> None:
        if closed.is_set():
            return
        closed.set()
        try:
            loop.portal.call(server.stop)
            run_future.result(timeout=60)
        finally:
            loop.stop()

    tm = LocalModel(
        server.base_url,
        model=plan.spec.alias,
        api_key=server.api_key,
        liveness=_ServerLiveness(server),
        on_close=on_close,
    )
    tm.server = server
    tm.plan = plan
    tm._loop = loop
    # A model dropped without close() (or still open at exit) stops its child gracefully:
    # weakref.finalize runs on garbage collection and, for what is left, at interpreter exit.
    weakref.finalize(tm, on_close)
    return tm
