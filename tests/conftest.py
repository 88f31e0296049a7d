"""Shared fixtures: the real llama-server binary and real GGUF files.

Tests run the llama-server that ``make test`` built (or ``FORGE_LLAMA_SERVER``): nothing here is a
mock. Every test is checked for leftover llama-server children of ours.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rocmforge_supervisor.config import ForgeSettings

# A session started in the background of a non-interactive shell (`cmd &`, `nohup`) inherits SIGINT
# ignored, and so would every `forge` it starts: the Ctrl-C tests would wait for an exit that an
# ignored signal never causes. A handler (not SIG_IGN) is reset to the default in exec'd children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def anyio_backend() -> str:
    """Every ``pytest.mark.anyio`` test runs on asyncio, the loop ``forge serve`` runs on."""
    return "asyncio"


@pytest.fixture(scope="session")
def forge_settings() -> ForgeSettings:
    return ForgeSettings()


@pytest.fixture(scope="session")
def llama_server_bin(forge_settings: ForgeSettings) -> Path:
    """The project's llama-server, found the way every command finds it."""
    from rocmforge_supervisor.binaries import locate_llama_server

    return locate_llama_server(forge_settings).path


@pytest.fixture(scope="session")
def llama_server_flags(forge_settings: ForgeSettings) -> tuple[str, ...]:
    """The flags forge gives every child of :func:`llama_server_bin` on this CPU (its self-test's
    workaround: ``--no-repack`` where ggml's AMX kernels crash): a test that starts the binary
    itself must add them, or it dies of SIGILL on an AMX CPU where forge's children do not."""
    from rocmforge_supervisor.binaries import locate_llama_server

    return locate_llama_server(forge_settings).child_args


@pytest.fixture(scope="session")
def gemma_path(forge_settings: ForgeSettings) -> Path:
    """The real gemma-3-270m Q4_K_M GGUF (the embedded base model: no chat template, SWA layers)."""
    from rocmforge_supervisor.models import BASE_MODEL, ensure_embedded

    return ensure_embedded(BASE_MODEL, forge_settings)


@pytest.fixture(scope="session")
def smollm2_path(forge_settings: ForgeSettings) -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF (the default chat model, with its own template)."""
    from rocmforge_supervisor.models import DEFAULT_MODEL, ensure_embedded

    return ensure_embedded(DEFAULT_MODEL, forge_settings)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few-MB random-weight llama-architecture GGUF with a small real vocabulary."""
    from tests.support.tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a random-weight CLIP projector beside it (``mmproj-tiny-vision.gguf``,
    which ``mmproj = "auto"`` finds): the real mtmd loads it and turns an image into 16 tokens."""
    from tests.support.tiny_clip import write_tiny_clip
    from tests.support.tiny_gguf import write_tiny_gguf

    folder = tmp_path_factory.mktemp("vision")
    write_tiny_clip(folder / "mmproj-tiny-vision.gguf")
    return write_tiny_gguf(folder / "tiny-vision.gguf")


@pytest.fixture
def state_settings(tmp_path: Path, llama_server_bin: Path) -> ForgeSettings:
    """Settings with a private state dir (logs, key files) and the located binary."""
    return ForgeSettings(state_dir=tmp_path / "state", llama_server=llama_server_bin)


def _is_llama(p: psutil.Process) -> bool:
    try:
        return "llama-server" in p.name() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _llama_children() -> set[int]:
    me = psutil.Process(os.getpid())
    return {p.pid for p in me.children(recursive=True) if _is_llama(p)}


@pytest.fixture(autouse=True)
def no_orphans() -> Iterator[None]:
    """Every test must leave no llama-server child of ours running."""
    before = _llama_children()
    yield
    leftover = [psutil.Process(pid) for pid in _llama_children() - before]
    _, alive = psutil.wait_procs(leftover, timeout=5)
    for p in alive:
        p.kill()
    assert not alive, f"llama-server children left running: {sorted(p.pid for p in alive)}"


@pytest.fixture(scope="session")
def rpc_server_bin(forge_settings: ForgeSettings) -> Path:
    """llama.cpp's RPC worker from the project's `forge build --rpc` (`make setup` builds it)."""
    from rocmforge_supervisor.binaries import locate_rpc_server

    return locate_rpc_server(forge_settings)


@pytest.fixture(scope="session")
def rpc_llama_server_bin(forge_settings: ForgeSettings) -> Path:
    """A llama-server that accepts --rpc (the same `forge build --rpc`)."""
    from rocmforge_supervisor.binaries import locate_llama_server

    return locate_llama_server(forge_settings, rpc=True).path


@pytest.fixture(scope="session")
def fake_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An executable named ``llama-server`` that runs tests/support/fake_llama_server.py (a FAKE:
    see its docstring) with ``argv[0] = llama-server``, for the state-machine and signal tests.

    One file for the session: a ``Supervisor`` given a binary self-tests it once per file (path,
    mtime, size), as it would a real one, and every test after the first reads that record."""
    fake = Path(__file__).resolve().parent / "support" / "fake_llama_server.py"
    path = tmp_path_factory.mktemp("fake-bin") / "llama-server"
    path.write_text(f'#!/bin/bash\nexec -a llama-server "{sys.executable}" "{fake}" "$@"\n')
    path.chmod(0o755)
    return path
