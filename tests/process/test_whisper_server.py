"""whisper-server on the one child lifecycle, for real (the project's build, whisper.cpp's own test
model): ready at its first /health 200, a model it cannot read and a port in use classified by
its own words, and the stop reaps it."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest

from rocmforge_supervisor import StartFailed
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.process import WHISPER_SERVER, InstanceSpec, ModelServer
from rocmforge_supervisor.process._whisper_server import WhisperServerKind
from tests.support.whisper import whisper_model_or_skip, whisper_server_or_skip

pytestmark = pytest.mark.anyio


def _spec(binary: Path, model: Path, tmp_path: Path, **kw: object) -> InstanceSpec:
    base: dict[str, object] = {
        "binary": binary,
        "model_path": model,
        "alias": "stt",
        "program": WHISPER_SERVER,
        "cpu_only": True,
        "log_path": tmp_path / "stt.log",
        "state_dir": tmp_path / "state",
        "stop_timeout": 5.0,
    }
    base.update(kw)
    return InstanceSpec(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def whisper_bin(forge_settings: ForgeSettings) -> Path:
    return whisper_server_or_skip(forge_settings)


async def test_ready_is_its_first_health_200_and_stop_reaps(
    whisper_bin: Path, forge_settings: ForgeSettings, tmp_path: Path
) -> None:
    model, _real = whisper_model_or_skip(forge_settings)
    async with ModelServer(_spec(whisper_bin, model, tmp_path)) as server:
        assert server.state == "ready"
        assert server.child.kind.program == "whisper-server"
        pid = server.pid
        assert pid is not None
        async with httpx.AsyncClient() as c:
            assert (await c.get(f"{server.base_url}/health")).status_code == 200
    assert server.returncode is not None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_a_file_that_is_no_whisper_model_is_named_as_such(whisper_bin: Path, tmp_path: Path) -> None:
    bad = tmp_path / "ggml-bad.bin"
    bad.write_bytes(b"not a model" * 100)
    with pytest.raises(StartFailed) as info:
        async with ModelServer(_spec(whisper_bin, bad, tmp_path)):
            pass
    assert info.value.reason == "invalid_model", info.value
    assert "whisper-server for 'stt' failed to start" in str(info.value)
    assert "whisper.cpp model" in (info.value.hint or "")


def test_a_port_in_use_is_a_bind_failure(whisper_bin: Path, forge_settings: ForgeSettings) -> None:
    """whisper-server's own words for a port someone holds (run directly: forge itself refuses a
    fixed port in use before spawning, and retries an unfixed one) are classified ``bind``, the
    reason :class:`ModelServer` retries on another port."""
    model, _real = whisper_model_or_skip(forge_settings)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        argv = [str(whisper_bin), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-ng"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    tail = (done.stdout + done.stderr).splitlines()[-15:]
    assert WhisperServerKind("stt").classify(tail, done.returncode) == "bind", tail
