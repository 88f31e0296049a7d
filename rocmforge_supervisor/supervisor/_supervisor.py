"""The supervisor behind ``forge serve``: a registry of managed models in one task group.

It owns every child (through :class:`~._managed.ManagedModel`), decides placement before each
start (the launch pipeline of :mod:`._launch`), and answers the HTTP layer's questions (acquire a
model, load, unload, reload, status). It never formats HTTP (errors cross as typed exceptions) and
never signals a process (``process/`` does).

No orphans, in three layers: children die with us (parent-death signal); a clean stop drains and
stops them all (shielded from cancellation); and at start, children recorded by a previous run
that are still alive are stopped (:class:`~..process.ChildLedger`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx

from .._errors import ForgeError, ModelRetired, ServiceError, UsageError
from ..binaries import locate_llama_server, selftest_of
from ..client import Upstream
from ..config import ForgeConfig, ForgeSettings, ModelConfig, WorkerConfig, unknown_served_name
from ..hardware import Inventory, detect, refresh_usage
from ..process import ChildLedger, ModelServer
from ._events import Event, EventBus, EventKind
from ._peers import PeerModel, PeerSet
from ._plan_inputs import group_rules, plan_entries, residency_of
from ._view import ModelView, model_view, peer_view
from ._yielding import PressureMonitor
from .admission._admission import PriorityClass
from .backends._backends import backend_of
from .contexts._context_store import ContextStore
from .contexts._keep_context import ContextKeeper
from .launch._launch import LaunchPlan
from .model._managed import ManagedModel
from .model._status import ModelState, ModelStatus
from .placement._config_plan import ConfigPlan, plan_config
from .placement._device_context import CONTEXT_FILE, DeviceContexts, learn_from_child
from .placement._placement import LoadedModel, PlacementDecision, PlacementPolicy
from .placement._residency import GroupRule

__all__ = ["ReloadSummary", "Supervisor"]

log = logging.getLogger("rocmforge.supervisor")

ReloadSummary = dict[str, list[str]]


class Supervisor:
    """Every configured model of one ``forge serve``, their children, and the placement lock.

    ``binary`` overrides the llama-server found from the settings (a test passes its fake here);
    its children get the flags its self-test recorded on this CPU, as a located binary's do.
    """

    def __init__(self, config: ForgeConfig, *, binary: Path | None = None) -> None:
        self.config = config
        self.settings: ForgeSettings = config.settings
        self.binary = binary
        #: Flags every child needs on this CPU: the binary's self-test workaround (set in run()).
        self.binary_args: tuple[str, ...] = ()
        #: The binary's self-test of a slot restore ("ok", "no-op: …", "" not run): a no-op turns
        #: the per-conversation tier off before its first turn (llama.cpp #26676).
        self.slot_restore = ""
        self.events = EventBus()
        self.log_bus = EventBus(history=0, buffer=1024)  # child log lines, for `forge logs -f`
        self.policy = config.supervisor
        self.models: dict[str, ManagedModel] = {}
        self.ready = anyio.Event()
        self.started_at = time.time()
        self.inventory: Inventory | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self.placement_lock = anyio.Lock()
        self._reload_lock = anyio.Lock()
        self.state_dir: Path = config.state_dir
        self.log_dir: Path = config.log_dir
        self.ledger = ChildLedger(self.state_dir)
        #: Yields device memory to other programs ([supervisor] vram_reserve, pressure_interval).
        self.pressure = PressureMonitor(self)
        #: ``keep_context``: every model's saved KV-cache slots, one disk budget.
        self.context_store = ContextStore(config.context_dir, config.server.context_max_bytes)
        self._keepers: dict[str, ContextKeeper] = {}
        #: The GPU backend's per-process context, measured on our children (placement counts it).
        self.device_contexts = DeviceContexts(self.settings.cache_dir / CONTEXT_FILE)
        #: ``[groups.*]`` as placement reads them (the residency rules; reloaded with the config).
        self.groups: dict[str, GroupRule] = _groups(config)
        #: Models an explicit unload took down: the warm default is not loaded back until used.
        self._held_off: set[str] = set()
        for name, mc in config.models.items():
            self.models[name] = self._new_model(name, mc, config)
        #: ``[peers.*]``: other servers' models, served through the same acquire (``_peers``).
        self.peers = self._new_peers(config)
        self.peers_config = config.peers
        self._peers_scope: anyio.CancelScope | None = None

    def _new_peers(self, config: ForgeConfig) -> PeerSet:
        def changed(peer: str, state: str, data: dict[str, Any]) -> None:
            self.events.publish(peer, EventKind.PEER, state, **data)

        return PeerSet(config.peers, lambda: self.models, on_change=changed)

    def _new_model(self, name: str, mc: ModelConfig, config: ForgeConfig) -> ManagedModel:
        fp = config.model_fingerprint(name) if name in config.models else ""
        m = ManagedModel(
            name,
            mc,
            policy=self.policy,
            events=self.events,
            plan=self._plan,
            fingerprint=fp,
            contexts=self.keeper(name),
        )
        m.on_ready.append(lambda _m: self.record_children())
        m.on_ready.append(self._learn_device_context)
        m.residency = residency_of(config, name, mc)
        return m

    def _learn_device_context(self, m: ManagedModel) -> None:
        """A child is ready: measure the device context it holds on its GPUs, in the background."""
        plan, server, inventory, tg = m.plan, m.server, self.inventory, self._tg
        if tg is None or plan is None or server is None or server.pid is None or inventory is None:
            return
        if plan.workers:  # its layers are on RPC workers: not this machine's devices
            return
        devices = [d for d in inventory.devices if d.key in plan.devices and d.vendor != "cpu"]
        if devices:
            allocated = plan.actual.device_totals()
            tg.start_soon(
                learn_from_child, self.device_contexts, devices, server.pid, allocated, self.settings
            )

    # -- life ----------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[Supervisor] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; then drain and stop every child (shielded)."""
        if self.binary is None:
            # With [[workers]] the children need --rpc: only an RPC build (`forge build --rpc`) has it.
            rpc = bool(self.config.workers)
            found = await anyio.to_thread.run_sync(lambda: locate_llama_server(self.settings, rpc=rpc))
            self.binary = found.path
            proof = found.selftest
        else:  # a binary named by the caller is proven on this CPU like a located one
            proof = await anyio.to_thread.run_sync(selftest_of, self.binary, self.settings)
        self.binary_args = proof.child_args if proof is not None else ()
        self.slot_restore = proof.slot_restore if proof is not None else ""
        for keeper in self._keepers.values():  # made with the models, before the binary was known
            self._check_restore(keeper)
        self.inventory = await anyio.to_thread.run_sync(detect, self.settings)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.ledger.reap_stale()
        # What status() shows of the saved contexts, read here once (then after each save/restore).
        await anyio.to_thread.run_sync(self.context_store.refresh, list(self.models))
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                preload = [m for m in self.models.values() if m.config.preload]
                for m in preload:
                    m.start_in(tg)
                tg.start_soon(self.pressure.run, name="memory pressure")
                tg.start_soon(self._watch_peers, name="peers")
                task_status.started(self)
                for m in preload:
                    await m.settled()
                self.ready.set()
                self.events.publish("*", EventKind.READY, preloaded=[m.name for m in preload])
                await self._keep_default_warm()
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                await self.stop_all()

    async def _watch_peers(self) -> None:
        """Read the peers' model lists now and every ``refresh`` seconds (redirects not followed:
        a peer's key goes to its own host only)."""
        async with httpx.AsyncClient(follow_redirects=False) as client:
            while True:
                peers = self.peers  # a reload may replace the set
                with anyio.CancelScope() as self._peers_scope:
                    await peers.run(client)
                    await anyio.sleep_forever()  # no peers: until a reload adds some

    async def stop_all(self) -> None:
        """Drain and stop every model at once (bounded by drain + stop timeouts)."""
        async with anyio.create_task_group() as tg:
            for m in list(self.models.values()):
                tg.start_soon(m.unload, "shutdown")
        self.record_children()

    def force_stop(self) -> None:
        """A forced exit: drains in progress end now, and the shutdown does not drain."""
        self.policy = self.policy.model_copy(update={"drain_timeout": 0.0})
        for m in self.models.values():
            m.set_policy(self.policy)
            m.cut_drain()

    def _start(self, m: ManagedModel) -> None:
        if self._tg is None:
            raise UsageError("the supervisor is not running", hint="start it with `forge serve`")
        self._held_off.discard(m.name)
        m.start_in(self._tg)

    # -- the warm default ------------------------------------------------------------------------

    def _default(self) -> ManagedModel | None:
        return next((m for m in self.models.values() if m.residency.default), None)

    async def _keep_default_warm(self) -> None:
        """``default = true``: load that model, idle, whenever it is not loaded and fits without
        unloading anything — at start, after another model stops (ttl, eviction, unload, crash),
        after a reload, and every ``_WARM_RETRY`` s (memory pressure ends without an event)."""
        while True:
            self._try_warm()
            async with self.events.subscribe() as received:
                with anyio.move_on_after(_WARM_RETRY):
                    async for ev in received:
                        if _frees_memory(ev, self._default()):
                            break

    def _try_warm(self) -> None:
        m = self._default()
        if m is None or m.running or m.retired or m.state == ModelState.FAILED or self._tg is None:
            return
        if m.name in self._held_off:
            return
        m.warming = True
        m.refused = None
        self.events.publish(m.name, EventKind.WARM)
        m.start_in(self._tg)

    def _spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        if self._tg is not None:
            self._tg.start_soon(fn, *args)

    # -- requests ------------------------------------------------------------------------------

    @property
    def workers(self) -> list[WorkerConfig]:
        """The configured RPC workers (``[[workers]]``)."""
        return self.config.workers

    def get(self, name: str) -> ManagedModel:
        try:
            return self.models[name]
        except KeyError:
            configs = {n: m.config for n, m in self.models.items()}
            raise unknown_served_name(name, configs) from None

    def _peer(self, name: str) -> PeerModel | None:
        """The peer model served as ``name`` when no local model has that name."""
        return None if name in self.models else self.peers.find(name)

    def view(self, name: str) -> ModelView:
        """Model ``name`` now, read-only: what the gateway reads of a model (404 when unknown)."""
        pm = self._peer(name)
        if pm is not None:
            return peer_view(pm, self.peers.status(pm))
        return model_view(self.get(name))

    def config_of(self, name: str) -> ModelConfig:
        """Model ``name``'s configuration (404 when unknown): what a request's checks read, without
        the whole :meth:`view` (which builds the model's status, ~20 us, on every request)."""
        m = self.models.get(name)
        if m is not None:
            return m.config
        pm = self.peers.find(name)
        return pm.config if pm is not None else self.get(name).config

    def names(self) -> list[str]:
        """The served models' names: the configured ones in configuration order, then the peers'."""
        return [*self.models, *self.peers.served]

    def views(self) -> list[ModelView]:
        """Every model now, in configuration order, then the peers' (one entry each)."""
        local = [model_view(m) for m in list(self.models.values())]
        return local + [peer_view(pm, self.peers.status(pm)) for pm in self.peers.shown()]

    def takes(self, name: str) -> bool:
        """Whether model ``name`` may take a request now, as a fallback: it exists, is not failed,
        and is not a peer cooling down (a stopped model counts: the request loads it)."""
        m = self.models.get(name)
        if m is not None:
            return m.state != ModelState.FAILED
        try:
            pm = self.peers.find(name)
        except ForgeError:
            return False
        return pm is not None and not self.peers.peers[pm.peer].cooling

    def hint_ttl(self, name: str, seconds: float | None) -> None:
        """A client's idle-TTL hint (Ollama's ``keep_alive``); None clears it. The config's
        ``ttl``, when set, wins. A peer's model is its server's to keep."""
        if self._peer(name) is None:
            self.get(name).ttl_hint = seconds

    async def child_gone(self, name: str, timeout: float) -> None:
        """After a request found model ``name``'s child unreachable: until its death has been
        noticed (at most ``timeout``); see :meth:`ManagedModel.child_gone`."""
        m = self.models.get(name)
        if m is not None:
            await m.child_gone(timeout)

    def load_wait(self, name: str) -> float:
        """Seconds a request waits for a loading model before a 503: the model's, else the server's."""
        own = self.config_of(name).load_wait
        return own if own is not None else self.config.server.load_wait

    @asynccontextmanager
    async def acquire(
        self,
        name: str,
        *,
        load_wait: float | None = None,
        loaded: Callable[[], None] | None = None,
        priority: PriorityClass = "interactive",
        key: str | None = None,
    ) -> AsyncIterator[Upstream]:
        """A slot at the model's child for one request, as an :class:`Upstream` (URL, key,
        liveness): the HTTP layer gets where to send, not the process. ``load_wait`` bounds the
        wait for a load (then :class:`ModelLoading`); None waits as long as the load takes.
        ``loaded`` is called once the model is ready, before the wait for a slot (a streamed
        request's keep-alive starts then: the load wait alone ends in a real 503). ``priority``
        and ``key`` place it in the model's admission queue (``_admission``). A peer's model: a
        place in its peer's queue, and the peer as the upstream."""
        if name not in self.models and self.peers.find(name) is not None:
            async with self.peers.acquire(name, priority=priority, key=key) as upstream:
                if loaded is not None:
                    loaded()
                yield upstream
            return
        async with AsyncExitStack() as stack:
            for _ in range(3):
                m = self.get(name)  # looked up again after a reload replaced the model
                try:
                    server = await stack.enter_async_context(
                        m.acquire(self._start, load_wait, loaded, priority, key)
                    )
                except ModelRetired:
                    continue
                yield _upstream(server)
                return
        raise ServiceError(f"model {name!r} is being reconfigured", hint="retry in a moment")

    async def load(self, name: str) -> ModelStatus:
        """Load (and wait until ready). Resets a failed model's breaker."""
        self._not_a_peer(name, "loaded")
        m = self.get(name)
        self._held_off.discard(name)
        m.reset()
        await m.wait_ready(self._start)
        return m.status()

    def keeper(self, name: str) -> ContextKeeper:
        """Model ``name``'s saved contexts (one keeper per name: it outlives a reload's replacement)."""
        keeper = self._keepers.get(name)
        if keeper is None:
            keeper = self._keepers[name] = ContextKeeper(name, self.context_store, self.events)
            self._check_restore(keeper)
        return keeper

    def _check_restore(self, keeper: ContextKeeper) -> None:
        """A binary whose restores are no-ops (its self-test) gets no per-conversation tier."""
        if self.slot_restore.startswith("no-op"):
            keeper.book.off = f"the build's self-test found it: {self.slot_restore}"

    async def unload(self, name: str, *, forget: bool = False) -> ModelStatus:
        """Drain and stop; ``forget``: without saving, and the saved contexts are deleted."""
        self._not_a_peer(name, "unloaded")
        m = self.get(name)
        self._held_off.add(name)
        await m.unload(save=not forget)
        if forget:
            await anyio.to_thread.run_sync(self.keeper(name).forget)
        self.record_children()
        return m.status()

    def _not_a_peer(self, name: str, verb: str) -> None:
        pm = self._peer(name)
        if pm is not None:
            raise UsageError(
                f"model {name!r} is peer {pm.peer!r}'s: it is {verb} on that server, not here",
                hint=f"run the command against {self.peers.peers[pm.peer].config.url}",
            )

    def status(self) -> list[ModelStatus]:
        """Every model's status, then the peers' models'; the control API sends each one's ``to_json()``."""
        return [m.status() for m in self.models.values()] + [
            self.peers.status(pm) for pm in self.peers.shown()
        ]

    async def add_model(self, name: str, path: Path) -> ModelStatus:
        """Register a model by path (the HTTP layer checked it is under model_dirs) and load it."""
        if name in self.models:
            raise UsageError(
                f"a model named {name!r} already exists", hint="choose another name, or unload it"
            )
        self.models[name] = self._new_model(name, ModelConfig(path=str(path)), self.config)
        self.peers.changed_locals()  # the name is local now, not a peer's
        return await self.load(name)

    async def plan(self) -> ConfigPlan:
        """``GET /api/plan``: the config placed on this machine's devices now, beside what is
        loaded (where each model would go, its estimate, its ``auto`` context, what it would
        unload); nothing is started or unloaded."""
        inventory = await self.refresh_inventory()
        entries = await anyio.to_thread.run_sync(plan_entries, self.config, self.settings, self.binary_args)
        contexts = await anyio.to_thread.run_sync(self.device_contexts.for_devices, inventory.devices)
        loaded: list[LoadedModel] = []
        current: dict[str, PlacementDecision] = {}
        for m in list(self.models.values()):
            held = m.as_loaded()
            if held is not None and m.plan is not None:
                loaded.append(held)
                current[m.name] = m.plan.decision
        policy = PlacementPolicy(device_context=contexts, groups=dict(self.groups), now=time.monotonic())
        return await anyio.to_thread.run_sync(
            lambda: plan_config(inventory, entries, policy, loaded=loaded, current=current)
        )

    # -- reload ----------------------------------------------------------------------------------

    async def reload(self, new_config: ForgeConfig) -> ReloadSummary:
        """Apply a new config: unchanged models keep running (limits updated in place); changed
        ones are replaced start-new-first; removed ones are drained; added ones registered."""
        async with self._reload_lock:
            self.config = new_config
            self.policy = new_config.supervisor
            self.groups = _groups(new_config)
            # The disk budget of kept contexts, from the next save on (a new context_dir: a restart).
            self.context_store.max_bytes = new_config.server.context_max_bytes
            summary: ReloadSummary = {
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
                if m.config.preload:
                    self._start(m)
            for name in sorted(old_names & new_names):
                await self._reload_one(self.models[name], new_config, summary)
            for name, m in self.models.items():  # rules change in place: no child restarts for them
                if name in new_config.models:
                    m.residency = residency_of(new_config, name)
            if new_config.peers != self.peers_config:
                self.peers = self._new_peers(new_config)
                self.peers_config = new_config.peers
                if self._peers_scope is not None:
                    self._peers_scope.cancel()  # the watcher reads the new set at once
            else:
                self.peers.changed_locals()
            await anyio.to_thread.run_sync(self.context_store.refresh, summary["added"])
            self.events.publish("*", EventKind.CONFIG, changes=summary)
            return summary

    async def _reload_one(self, old: ManagedModel, new_config: ForgeConfig, summary: ReloadSummary) -> None:
        name = old.name
        if new_config.model_fingerprint(name) == old.fingerprint:
            summary["unchanged"].append(name)
            old.update_limits(new_config.models[name])
            old.set_policy(self.policy)
            if old.state == ModelState.FAILED:
                old.reset()
            return
        summary["changed"].append(name)
        if not await self._replace(old, self._new_model(name, new_config.models[name], new_config)):
            summary["failed"].append(name)

    async def _replace(self, old: ManagedModel, new: ManagedModel) -> bool:
        """Start-new-first. False when the new config does not come up and the old one stays."""
        if not old.running:
            old.retired = True
            self.models[new.name] = new
            if new.config.preload:
                self._start(new)
            return True
        if old.plan is not None and old.plan.workers:
            # Its RPC workers serve one client at a time: a replacement started first would wait
            # for them forever (and the reload with it). Stop it, then start the new config.
            log.info("model %s: on RPC workers; stopping it before its replacement starts", new.name)
            old.retired = True
            await old.unload("replaced")
            self.models[new.name] = new
            self._start(new)
            return True
        # Start the replacement first; the old one serves until the new one is ready. A kept
        # context is saved first (the old child keeps running) so that the new one restores it.
        if old.config.keep_context and new.config.keep_context:
            await old.snapshot_context()
        self._start(new)
        if await new.settled() == ModelState.READY:
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

    # -- the launch pipeline, with eviction in the middle ------------------------------------------

    async def _plan(self, m: ManagedModel) -> LaunchPlan:
        """The model's backend plans its launch (the backends table): resolve, place, argv."""
        return await backend_of(m.config).plan(self, m)

    async def refresh_inventory(self) -> Inventory:
        if self.inventory is None:
            self.inventory = await anyio.to_thread.run_sync(detect, self.settings)
        self.inventory = await anyio.to_thread.run_sync(refresh_usage, self.inventory, self.settings)
        return self.inventory

    def log_forwarder(self, name: str) -> Callable[[str], None]:
        def forward(line: str) -> None:
            if self.log_bus.listened:  # a serving child prints ~110 lines per request: no event for nobody
                self.log_bus.publish(name, EventKind.LOG, line=line)

        return forward

    def record_children(self) -> None:
        """The ledger the next run's stale-child sweep reads."""
        self.ledger.record((m.name, m.server) for m in self.models.values() if m.server is not None)


#: Seconds between looks at whether the warm default fits again, with no event to say so.
_WARM_RETRY = 30.0

#: States in which a model holds no memory any more.
_GONE = frozenset({ModelState.STOPPED.value, ModelState.FAILED.value, ModelState.UNLOADED.value})


def _frees_memory(ev: Event, default: ManagedModel | None) -> bool:
    """Whether ``ev`` may have made room for the warm default: another model stopped, or a reload."""
    if ev.kind == EventKind.CONFIG:
        return True
    return ev.kind == EventKind.STATE and ev.state in _GONE and (default is None or ev.model != default.name)


def _groups(config: ForgeConfig) -> dict[str, GroupRule]:
    return group_rules(config)


#: Each serving child's :class:`Upstream`, built at its first request: its URL and key are fixed
#: for its life, so a request reads them here instead of through the process objects. Weak: it
#: goes with the child.
_UPSTREAMS: weakref.WeakKeyDictionary[ModelServer, Upstream] = weakref.WeakKeyDictionary()


def _upstream(server: ModelServer) -> Upstream:
    """Where the HTTP layer sends one request: the child's URL, key and liveness, not the process."""
    upstream = _UPSTREAMS.get(server)
    if upstream is None:
        held = weakref.ref(server)  # the entry must not keep its own key alive

        def alive() -> bool:
            s = held()
            return s is not None and s.alive

        upstream = _UPSTREAMS[server] = Upstream(server.base_url, server.api_key, is_alive=alive)
    return upstream
