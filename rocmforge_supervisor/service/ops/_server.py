"""``forge serve``: the supervisor, the gateway and systemd's protocol in one event loop.

Signals only queue (anyio's signal receiver); one loop dispatches them: SIGHUP reloads the config
(RELOADING=1 … READY=1), SIGTERM/SIGINT stop (STOPPING=1): the gateway stops accepting, in-flight
requests drain (bounded), every child is stopped, and only then does the process exit.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import uvicorn
from starlette.types import ASGIApp

from ..._errors import ConfigError, ForcedExit, ForgeError, ServiceError
from ..._files import write_text_atomic
from ...config import ForgeConfig, ForgeSettings, ServerConfig
from ...process import SdNotifier, StateDirLock, unwrap_group
from ...supervisor import EventKind, ModelState, Supervisor
from .._app import GatewayState, create_app
from ..control._observe import MetricsPort
from ..core._logging import relog
from ..core._recording import open_store
from ._batches import open_batches
from ._info import ServiceInfo, read_service_info, service_info_path
from ._watch import watch_config

__all__ = ["ServiceInfo", "loop_options", "read_service_info", "run_service", "service_info_path"]

log = logging.getLogger("rocmforge.service")


def loop_options() -> dict[str, Any]:
    """uvloop (a dependency on Linux; uvicorn picks httptools by itself): the gateway's per-chunk
    cost is event-loop bound. Looked up, not imported: a platform without it still serves."""
    return {"use_uvloop": True} if importlib.util.find_spec("uvloop") is not None else {}


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the service's loop owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int, key: str = "port") -> socket.socket:
    """The listening socket, made here (not by uvicorn) so its address is known before serving.
    ``key`` is the ``[server]`` key that chose ``port``: the error names the one to change.

    ``proto`` must be ``IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` on accepted connections only
    when the listening socket says so. With proto 0, every response after the first on a
    keep-alive connection waited ~40 ms (Nagle meeting the client's delayed ACK). ``TCP_NODELAY``
    on the listening socket too: Linux copies it to the sockets ``accept`` returns (uvloop's path).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServiceError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint=f"choose another server.{key} (0 picks a free one), or stop what uses it",
        ) from exc
    sock.listen(2048)
    # Not inheritable (Python's default, said here because it matters): uvloop spawns children with
    # libuv, which ignores close_fds, so every llama-server inherited the gateway's listener. After
    # uvicorn closed its copy at SIGTERM the kernel still queued new connections on the children's
    # copy, and nothing ever accepted them: a client hung instead of being refused.
    sock.set_inheritable(False)
    return sock


def _url(sock: socket.socket, scheme: str = "http") -> str:
    host, port = sock.getsockname()[:2]
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def _bind_all(server_cfg: ServerConfig) -> list[socket.socket]:
    """The main socket, ``ollama_port``'s when set (Ollama clients look on 11434, so the same app,
    every route, the same auth, listens there too), then ``metrics_port``'s (``/metrics`` alone)."""
    sockets = [_bind(server_cfg.host, server_cfg.port)]
    extra = [
        (server_cfg.host, server_cfg.ollama_port, "ollama_port"),
        (server_cfg.metrics_host, server_cfg.metrics_port, "metrics_port"),
    ]
    for host, port, key in extra:
        if port is None:
            continue
        try:
            sockets.append(_bind(host, port, key))
        except ServiceError:
            for s in sockets:
                s.close()
            raise
    return sockets


def _warn_plain_http(server: ServerConfig) -> None:
    """Keys (and every prompt and answer) in clear text across a network: a warning, not a refusal,
    so that a config that started before TLS existed still starts (a proxy may do TLS in front)."""
    keyed = server.api_key is not None or bool(server.keys)
    if keyed and not server.tls and not server.is_loopback:
        log.warning(
            "host %s is reachable from the network and serves plain HTTP: API keys, prompts and answers "
            "cross it unencrypted; set server.tls_cert and server.tls_key (or put a TLS proxy in front)",
            server.host,
        )


def _write_info(path: Path, info: ServiceInfo) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(info))


async def run_service(
    config: ForgeConfig,
    settings: ForgeSettings,
    *,
    config_path: Path | None,
    load_config: Callable[[], ForgeConfig] | None = None,
    notifier: SdNotifier | None = None,
    on_listening: Callable[[str, str | None], None] | None = None,
    on_stopped: Callable[[str, list[str]], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; drain; stop every child. A second signal during the drain cuts
    it short (uvicorn's ``force_exit``) and ends in :class:`ForcedExit` (exit status 128 + signal).

    ``settings`` are the ones ``config`` was loaded with (kept for the CLI's call).
    ``on_stopped(signal name, models whose child was stopped)``: called once all is stopped.
    """
    lock = StateDirLock(config.state_dir)
    lock.acquire()  # first: a second service on this state dir is refused before it binds or sweeps
    try:
        await _run_locked(
            config,
            config_path=config_path,
            load_config=load_config,
            notifier=notifier,
            on_listening=on_listening,
            on_stopped=on_stopped,
        )
    finally:
        lock.release()


async def _run_locked(
    config: ForgeConfig,
    *,
    config_path: Path | None,
    load_config: Callable[[], ForgeConfig] | None,
    notifier: SdNotifier | None,
    on_listening: Callable[[str, str | None], None] | None,
    on_stopped: Callable[[str, list[str]], None] | None = None,
) -> None:
    supervisor = Supervisor(config)
    sockets = _bind_all(config.server)
    sock = sockets[0]
    scheme = config.server.scheme
    base_url = _url(sock, scheme)
    ollama_url = _url(sockets[1], scheme) if config.server.ollama_port is not None else None
    _warn_plain_http(config.server)
    if config.server.watch_config and config_path is None:
        log.warning("watch_config: no config file to watch (start forge serve with --config)")
    info_path = service_info_path(supervisor.state_dir)
    metrics_port = sockets[-1].getsockname()[1] if config.server.metrics_port is not None else None
    state, uv = _gateway(config, supervisor, None, metrics_port)
    close_batches = open_batches(config, state, state.app)  # /v1/batches' runner
    reload = state.reload = _reloader(supervisor, state, load_config, notifier) if load_config else None
    forced: int | None = None
    signame: str | None = None  # the signal that stopped it, and the models that were running
    running: list[str] = []
    try:
        async with anyio.create_task_group() as tg:
            with anyio.open_signal_receiver(signal.SIGHUP, signal.SIGTERM, signal.SIGINT) as signals:
                await tg.start(supervisor.run)
                gateway_done = anyio.Event()
                tg.start_soon(_serve_gateway, uv, sockets, gateway_done)
                _publish(
                    info_path,
                    base_url,
                    config_path,
                    sockets,
                    ollama=config.server.ollama_port is not None,
                    metrics=metrics_port is not None,
                    tls_cert=config.server.tls_cert,
                )
                if on_listening is not None:
                    on_listening(base_url, ollama_url)
                tg.start_soon(_announce_ready, supervisor, notifier)
                if state.batch_runner is not None:  # ends when the service starts stopping
                    tg.start_soon(state.batch_runner.run, state.closing)
                if reload is not None and config_path is not None:
                    tg.start_soon(
                        watch_config,
                        config_path,
                        reload,
                        supervisor.events,
                        lambda: state.server.watch_config,
                    )
                if notifier is not None and notifier.watchdog_interval:
                    tg.start_soon(_watchdog, notifier, notifier.watchdog_interval)
                signame = await _until_stop(signals, tg, reload, notifier)
                running = [v.name for v in supervisor.views() if v.child is not None]
                state.closing.set()  # endless streams end now, not at the end of the grace period
                forced = await _drain(signals, uv, supervisor, gateway_done)
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # a start-up error (no binary…): the CLI prints one line
        inner = unwrap_group(group)
        if isinstance(inner, ForgeError):
            raise inner from None
        raise
    finally:
        for s in sockets:
            s.close()
        with anyio.CancelScope(shield=True):
            await state.upstream.aclose()
            await state.streams.aclose()
            await close_batches()
            if state.recorder.store is not None:  # what is queued is committed
                await anyio.to_thread.run_sync(state.recorder.store.close)
        info = read_service_info(supervisor.state_dir)
        if info is not None and info.get("pid") == os.getpid():
            info_path.unlink(missing_ok=True)
    if forced is not None:
        raise ForcedExit(forced)
    if on_stopped is not None and signame is not None:
        on_stopped(signame, running)


async def _serve_gateway(uv: _Uvicorn, sockets: list[socket.socket], done: anyio.Event) -> None:
    try:
        await uv.serve(sockets)
    finally:
        done.set()


def _publish(
    info_path: Path,
    base_url: str,
    config_path: Path | None,
    sockets: list[socket.socket],
    *,
    ollama: bool,
    metrics: bool,
    tls_cert: Path | None,
) -> None:
    """service.json: how ``forge ps``/``chat``/``load`` find this service (removed at exit), and
    with TLS the certificate it serves, which they then require of it (``ServiceClient``)."""
    info = {
        "url": base_url,
        "tls_cert": str(tls_cert.resolve()) if tls_cert is not None else None,
        "pid": os.getpid(),
        "config": str(config_path) if config_path else None,
        "ollama_port": sockets[1].getsockname()[1] if len(sockets) > 1 and ollama else None,
        "metrics_port": sockets[-1].getsockname()[1] if metrics else None,
    }
    _write_info(info_path, info)


def _gateway(
    config: ForgeConfig, supervisor: Supervisor, reload: Callable[[], Any] | None, metrics_port: int | None
) -> tuple[GatewayState, _Uvicorn]:
    server_cfg = config.server
    store = open_store(config)
    state = GatewayState(supervisor, config, reload=reload, activity=store)
    if store is not None and store.problem is None:  # a restart does not hand a key a fresh day
        with contextlib.suppress(Exception):
            state.recorder.limiter.seed(store.tokens_since(time.time() - 86400))
    app: ASGIApp = create_app(state)
    state.app = app  # the app without the metrics port's wrapper: the batch runner's way in
    if metrics_port is not None:  # that listener: /metrics alone, no key
        app = MetricsPort(app, state, metrics_port)
    uv = _Uvicorn(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=5,
            timeout_graceful_shutdown=int(supervisor.policy.drain_timeout),
            backlog=2048,
            limit_concurrency=None,
            # Every listener (main, Ollama, metrics) serves HTTPS when these are set.
            ssl_certfile=str(server_cfg.tls_cert) if server_cfg.tls_cert is not None else None,
            ssl_keyfile=str(server_cfg.tls_key) if server_cfg.tls_key is not None else None,
        )
    )
    return state, uv


#: ``[server]`` keys read once, at start: the listening sockets and their TLS files, and where
#: state, logs and saved contexts live (the lock, the children's log files and slot-save paths are
#: there). A reload that changes one says so — ``restart_required`` in its answer, a
#: ``restart_required`` event, a warning in the log — and the service keeps the old value; every
#: other key applies from the next request on (``GatewayState.server``).
_RESTART_ONLY = (
    "host",
    "port",
    "ollama_port",
    "metrics_port",
    "metrics_host",
    "tls_cert",
    "tls_key",
    "state_dir",
    "log_dir",
    "context_dir",
)


def _restart_required(running: ServerConfig, new: ServerConfig) -> list[str]:
    """The ``server.*`` settings of ``new`` that differ from those the service started with
    (``running``) and that only a restart applies."""
    return [f"server.{k}" for k in _RESTART_ONLY if getattr(running, k) != getattr(new, k)]


def _reloader(
    supervisor: Supervisor,
    state: GatewayState,
    load_config: Callable[[], ForgeConfig],
    notifier: SdNotifier | None,
) -> Callable[[], Awaitable[dict[str, list[str]]]]:
    lock = anyio.Lock()
    started = supervisor.config.server  # what the restart-only settings still are, reload after reload

    async def reload() -> dict[str, list[str]]:
        async with lock:
            if notifier is not None:
                notifier.reloading("reloading config")
            try:
                new = await anyio.to_thread.run_sync(load_config)
                summary = await supervisor.reload(new)
                await _apply_server(state, new)
                log.info("config reloaded: %s", summary)
                if pending := _restart_required(started, new.server):
                    summary["restart_required"] = pending
                    message = (
                        f"{', '.join(pending)} changed: restart forge serve to apply (it keeps the old value)"
                    )
                    log.warning("config reloaded, but %s", message)
                    supervisor.events.publish("*", EventKind.RESTART_REQUIRED, keys=pending, message=message)
                return summary
            except ConfigError as exc:
                log.error("reload refused, the running config stays: %s", exc)
                raise
            finally:
                if notifier is not None:
                    notifier.ready(_status_line(supervisor))

    return reload


async def _apply_server(state: GatewayState, new: ForgeConfig) -> None:
    """The new ``[server]`` section in force: the log format, the activity store opened or closed
    when ``server.activity`` changed (its file work off the event loop), then the gateway's."""
    if relog(new.server.log_format, new.settings):
        log.info("log format: %s (server.log_format)", new.server.log_format)
    store = state.recorder.store
    if new.server.activity and store is None:
        state.recorder.store = await anyio.to_thread.run_sync(open_store, new)
        log.info("activity log on (server.activity = true)")
    elif not new.server.activity and store is not None:
        state.recorder.store = None  # requests that end from now on are not recorded
        await anyio.to_thread.run_sync(store.close)  # what is queued is committed
        log.info("activity log off (server.activity = false)")
    state.apply(new)


async def _until_stop(
    signals: AsyncIterator[int],
    tg: anyio.abc.TaskGroup,
    reload: Callable[[], Any] | None,
    notifier: SdNotifier | None,
) -> str:
    """Until SIGTERM or SIGINT (its name is returned); SIGHUP reloads the config meanwhile."""
    async for signum in signals:
        if signum == signal.SIGHUP:
            if reload is None:
                log.error("SIGHUP: no config file to reload (start forge serve with --config)")
                continue
            # In the background: a replacement can take minutes to load, and a SIGTERM meanwhile
            # must still be seen. Reloads are serialised by a lock.
            tg.start_soon(_reload_quietly, reload)
            continue
        name = signal.Signals(signum).name
        log.info("received %s: stopping", name)
        if notifier is not None:
            notifier.stopping("stopping: draining requests and children")
        return name
    return "end of signals"  # the receiver never ends while it is open


async def _drain(
    signals: AsyncIterator[int], uv: _Uvicorn, supervisor: Supervisor, gateway_done: anyio.Event
) -> int | None:
    """Stop accepting; let in-flight responses finish (bounded by uvicorn's grace); stop every child
    on purpose (:meth:`Supervisor.stop_all`: drain, save kept contexts, stop); then the caller
    cancels the rest (Supervisor.run's shielded cleanup stops whatever is left).

    A second SIGTERM/SIGINT meanwhile forces the exit, as uvicorn's does: responses in flight are
    cut off, children are stopped without a drain. Returns that signal's number, if one came.
    """
    uv.should_exit = True
    forced: int | None = None
    async with anyio.create_task_group() as tg:

        async def second_signal() -> None:
            nonlocal forced
            async for signum in signals:
                if signum in (signal.SIGTERM, signal.SIGINT):
                    forced = signum
                    log.warning("received %s again: forcing the exit", signal.Signals(signum).name)
                    uv.force_exit = True
                    supervisor.force_stop()
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(second_signal)
        with anyio.move_on_after(supervisor.policy.drain_timeout + 5):
            await _close_connections_when_drained(uv, gateway_done)
            await gateway_done.wait()
        # A planned stop of every child while they still run (cancelling the supervisor would stop
        # them at once): keep_context models save their slots first. A second signal cuts it short.
        await supervisor.stop_all()
        tg.cancel_scope.cancel()
    return forced


#: How long a connection closed at shutdown, with nothing left to send, may wait for its peer
#: before it is aborted: a TLS close waits for the client's ``close_notify``, which a pooling
#: client holding the connection idle never reads, so never sends (asyncio's own bound is 30 s).
_CLOSE_GRACE = 0.5


async def _close_connections_when_drained(uv: _Uvicorn, gateway_done: anyio.Event) -> None:
    """Drain *requests*, not connections: once uvicorn has stopped accepting and no request is in
    flight, close the connections that are left.

    uvicorn's graceful shutdown asks each connection it knows to close after its response, then
    waits until the set of connections is empty. A connection it did not ask — accepted in the same
    loop turn as the shutdown, so that it joined the set after uvicorn went through it (uvloop
    calls ``connection_made`` a turn after the accept) — stays open as long as its client likes,
    and the service would wait the whole drain period on it with nothing in flight: a drain
    that stalls. uvicorn polls every 0.1 s; so does this, on its request tasks.

    Over TLS a close is a handshake: the transport sends ``close_notify`` and is gone only once
    the client answers with its own. An idle keep-alive connection in a client's pool is not read,
    so the answer never comes; a connection still open ``_CLOSE_GRACE`` after its close, with
    nothing left to send, is aborted (over plain HTTP the close is immediate: nothing is left).
    """
    state = uv.server_state
    idle_since: float | None = None  # since when nothing has been in flight
    while not gateway_done.is_set():
        servers = getattr(uv, "servers", [])
        if not any(s.is_serving() for s in servers) and not state.tasks:
            for connection in list(state.connections):
                connection.shutdown()  # idle: closed now; a response in flight: closed after it
            if not state.connections:
                return
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            elif now - idle_since >= _CLOSE_GRACE:
                for connection in list(state.connections):
                    _abort_if_sent(connection)
        else:
            idle_since = None
        await anyio.sleep(0.05)


def _abort_if_sent(connection: object) -> None:
    """Abort a closing connection's transport once it has nothing left to send (the tail of a
    response to a slow reader still goes out)."""
    transport = getattr(connection, "transport", None)
    if transport is None or not transport.is_closing():
        return
    if transport.get_write_buffer_size() == 0:
        transport.abort()


async def _reload_quietly(reload: Callable[[], Any]) -> None:
    try:
        await reload()
    except ForgeError as exc:  # already logged; the running config stays
        log.debug("reload refused: %s", exc)
    except Exception:  # a bug in a reload must not take the service down
        log.exception("reload failed; the running config stays")


def _status_line(supervisor: Supervisor) -> str:
    """The start line and systemd's status: the preloaded models (what the start waits for), then
    the others, which load on a request ("1 of 1 preloaded model ready; 3 more load on first
    request")."""
    rows = supervisor.status()
    warm = {r.name for r in rows if supervisor.config_of(r.name).preload}
    ready = {r.name for r in rows if r.state == ModelState.READY}
    failed = [r.name for r in rows if r.state == ModelState.FAILED]
    n = len(warm)
    line = (
        f"{len(warm & ready)} of {n} preloaded model{'' if n == 1 else 's'} ready"
        if n
        else "no model preloaded"
    )
    if loaded := len(ready - warm):
        line += f"; {loaded} more loaded on request"
    if later := sum(1 for r in rows if r.name not in warm | ready and r.state != ModelState.FAILED):
        line += f"; {later} {'more ' if n or loaded else ''}load{'s' if later == 1 else ''} on first request"
    if failed:
        line += f"; failed: {', '.join(failed)}"
    return line


async def _announce_ready(supervisor: Supervisor, notifier: SdNotifier | None) -> None:
    # READY=1 comes after the preloads; a big model can take longer than systemd's start timeout,
    # so keep extending it while they load.
    while not supervisor.ready.is_set():
        if notifier is not None:
            notifier.extend_timeout(30)
            notifier.status("loading: " + _status_line(supervisor))
        with anyio.move_on_after(10):
            await supervisor.ready.wait()
    log.info("ready: %s", _status_line(supervisor))
    if notifier is not None:
        notifier.ready(_status_line(supervisor))
    async with supervisor.events.subscribe() as events:
        async for _ev in events:
            if notifier is not None:
                notifier.status(_status_line(supervisor))


async def _watchdog(notifier: SdNotifier, interval: float) -> None:
    while True:
        notifier.watchdog()
        await anyio.sleep(interval)
