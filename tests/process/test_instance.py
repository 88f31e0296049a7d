"""One llama-server child, for real: readiness, failure classification, stop, no orphans."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import psutil
import pytest

from rocmforge_supervisor import StartFailed, UsageError
from rocmforge_supervisor.process import InstanceSpec, ModelServer
from rocmforge_supervisor.process import _instance as instance_module

pytestmark = pytest.mark.anyio


def _spec(binary: Path, model: Path, tmp_path: Path, **kw: object) -> InstanceSpec:
    base: dict[str, object] = {
        "binary": binary,
        "model_path": model,
        "alias": "m",
        "ctx_size": 512,
        "cpu_only": True,
        "log_path": tmp_path / "m.log",
        "state_dir": tmp_path / "state",
        "stop_timeout": 5.0,
    }
    base.update(kw)
    return InstanceSpec(**base)  # type: ignore[arg-type]


@contextlib.contextmanager
def _first_port_taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The first port the child is given is held by someone else (a listening socket of the
    test's); later ones come from the OS as usual. Yields the taken port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        real_free_port = instance_module.free_port
        ports = iter([taken_port])
        monkeypatch.setattr(
            instance_module, "free_port", lambda host: next(ports, None) or real_free_port(host)
        )
        yield taken_port


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


async def test_ready_means_health_200_and_stop_reaps(
    llama_server_bin: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    async with ModelServer(_spec(llama_server_bin, tiny_gguf, tmp_path)) as server:
        assert server.state == "ready"
        assert server.listening_at is not None and server.ready_monotonic is not None
        async with httpx.AsyncClient() as c:
            r = await c.get(f"{server.base_url}/health")
            assert r.status_code == 200
            # The child only answers requests carrying the supervisor's secret.
            r = await c.post(f"{server.base_url}/v1/completions", json={"prompt": "a", "max_tokens": 1})
            assert r.status_code == 401
        pid = server.pid
        assert pid is not None
        # The key file was read at start and removed once ready: no secret left on disk.
        assert not list((tmp_path / "state" / "run").glob("*.key"))
        # The key is not on the command line either.
        assert server.api_key not in " ".join(psutil.Process(pid).cmdline())
    assert server.returncode == 0  # SIGTERM after load: a clean exit
    assert _gone(pid)
    log = (tmp_path / "m.log").read_text()
    assert "listening on" in log and "exited with code 0" in log


async def test_inherited_llama_env_does_not_reach_the_child(
    llama_server_bin: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    env = dict(os.environ, LLAMA_ARG_PORT="1", LLAMA_API_KEY="leak", LLAMA_ARG_CTX_SIZE="7")
    async with ModelServer(_spec(llama_server_bin, tiny_gguf, tmp_path, parent_env=env)) as server:
        assert server.pid is not None
        child_env = psutil.Process(server.pid).environ()
        assert not any(k.startswith("LLAMA_ARG_") for k in child_env)
        assert "LLAMA_API_KEY" not in child_env
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {server.api_key}"}) as c:
            props = (await c.get(f"{server.base_url}/props")).json()
        assert props["default_generation_settings"]["n_ctx"] != 7


async def test_truncated_gguf_is_classified_with_stderr(
    llama_server_bin: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "truncated.gguf"
    broken.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])  # noqa: ASYNC240
    with pytest.raises(StartFailed) as info:
        async with ModelServer(_spec(llama_server_bin, broken, tmp_path)):
            pass
    err = info.value
    assert err.reason == "invalid_model"
    assert err.returncode == 1
    assert err.stderr_tail and any("load" in line for line in err.stderr_tail)


async def test_missing_file_is_classified(llama_server_bin: Path, tmp_path: Path) -> None:
    with pytest.raises(StartFailed) as info:
        async with ModelServer(_spec(llama_server_bin, tmp_path / "nope.gguf", tmp_path)):
            pass
    assert info.value.reason == "file_not_found"


async def test_sigstop_during_load_hits_the_stall_timeout(
    llama_server_bin: Path, llama_server_flags: tuple[str, ...], gemma_path: Path, tmp_path: Path
) -> None:
    # gemma's weights are quantized: on an AMX CPU the child needs the flags forge gives its own
    # (--no-repack), or it dies of SIGILL before the fault this test injects.
    spec = _spec(llama_server_bin, gemma_path, tmp_path, stall_timeout=1.5, extra_args=llama_server_flags)
    server = ModelServer(spec)

    async def freeze_when_spawned() -> None:
        while server.pid is None:  # noqa: ASYNC110 — nothing to wait on: pid is set by the spawn
            await anyio.sleep(0.001)
        os.kill(server.pid, signal.SIGSTOP)  # fault injection: a hung load

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(freeze_when_spawned)
        with pytest.raises(StartFailed) as info:
            await server.run()
    assert info.value.reason == "timeout"
    assert time.monotonic() - started < 15
    assert server.pid is not None and _gone(server.pid)


async def test_cancel_during_load_leaves_no_child(
    llama_server_bin: Path, llama_server_flags: tuple[str, ...], gemma_path: Path, tmp_path: Path
) -> None:
    # With forge's flags for this CPU (as above): without them an AMX CPU's child may die of SIGILL
    # before the cancel, and the test would see that failure instead of its cancel.
    server = ModelServer(_spec(llama_server_bin, gemma_path, tmp_path, extra_args=llama_server_flags))
    with anyio.move_on_after(0.3) as scope:
        await server.run()
    assert scope.cancelled_caught
    assert server.pid is not None
    assert _gone(server.pid, timeout=1.0)


async def test_explicit_port_in_use_is_refused(
    llama_server_bin: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(UsageError, match=f"port {port}"):
            async with ModelServer(_spec(llama_server_bin, tiny_gguf, tmp_path, port=port)):
                pass


async def test_bind_race_is_retried_on_another_port(
    llama_server_bin: Path, tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fault injection: the first "free" port is taken by someone else before the child binds it.
    with _first_port_taken(monkeypatch) as taken_port:
        async with ModelServer(_spec(llama_server_bin, tiny_gguf, tmp_path)) as server:
            assert server.port != taken_port
        log = (tmp_path / "m.log").read_text()
        # The child's own line, or (when it exited before its logging thread wrote anything, seen
        # under CPU load) forge's note of what it saw itself: the port held by someone else.
        assert "couldn't bind" in log or f"port {taken_port} is held by another process" in log


def test_parent_sigkill_takes_the_child_down(llama_server_bin: Path, tiny_gguf: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from rocmforge_supervisor.process import InstanceSpec, ModelServer
        import anyio
        async def main():
            spec = InstanceSpec(binary=Path({str(llama_server_bin)!r}), model_path=Path({str(tiny_gguf)!r}),
                                alias="m", ctx_size=512, cpu_only=True, state_dir=Path({str(tmp_path)!r}))
            async with ModelServer(spec) as s:
                print(s.pid, flush=True)
                await anyio.sleep_forever()
        anyio.run(main)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(child_pid)
        parent.kill()  # SIGKILL: no cleanup code of ours runs
        parent.wait()
        assert _gone(child_pid, timeout=2.0), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


@pytest.mark.parametrize(
    ("amx", "args", "reason"),
    [
        (True, [], "amx_fault"),  # an AMX CPU, no workaround: ggml's AMX defect, not the build
        (True, ["--no-repack"], "illegal_instruction"),  # the workaround was on: a real ISA fault
        (False, [], "illegal_instruction"),
    ],
)
async def test_sigill_advice_names_the_amx_workaround_where_it_applies(
    fake_bin: Path, tiny_gguf: Path, tmp_path: Path, amx: bool, args: list[str], reason: str
) -> None:
    """The round-3 check on an AMX Xeon: a child without ``--no-repack`` died of SIGILL and forge
    said ``forge build --force``, which rebuilds the same crash. On an AMX CPU without the
    workaround the advice is the flag and the self-test; elsewhere it stays a rebuild. (The FAKE
    llama-server dies of the real SIGILL while loading.)"""
    spec = _spec(fake_bin, tiny_gguf, tmp_path, amx=amx, extra_args=["--fake-die", "SIGILL", *args])
    with pytest.raises(StartFailed) as info:
        async with ModelServer(spec):
            pass
    err = info.value
    assert err.reason == reason and "SIGILL" in err.message
    advice = f"{err.message} {err.hint}"
    if reason == "amx_fault":
        assert "--no-repack" in advice and "AMX" in advice and "forge build --force" not in advice
    else:
        assert "forge build --force" in advice and "AMX" not in advice


async def test_a_child_that_exits_silently_is_judged_by_what_forge_sees(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server logs from a thread of its own: under CPU load one that exits right away (a
    port taken, a missing file) printed nothing 11 times in 15. ``/bin/false`` stands in for that
    child here (exit 1, no output): a port someone else holds is a bind failure (retried on
    another port), a model file that is not there is named, anything else stays a crash."""
    with _first_port_taken(monkeypatch) as taken_port, pytest.raises(StartFailed) as info:
        async with ModelServer(_spec(Path("/bin/false"), tiny_gguf, tmp_path)):
            pass
    assert info.value.reason == "crashed"  # the second port was free: a plain silent crash
    assert f"port {taken_port} is held by another process" in (tmp_path / "m.log").read_text()

    with pytest.raises(StartFailed) as missing:
        async with ModelServer(_spec(Path("/bin/false"), tmp_path / "gone.gguf", tmp_path)):
            pass
    assert missing.value.reason == "file_not_found" and "gone.gguf does not exist" in missing.value.message
