"""Every kind of model in the backends table is placed, evicted and refused by the same rules: the
real Supervisor, with the FAKE llama-server as every child (run as llama-server, as whisper-server
through ``FORGE_WHISPER_SERVER``, and as a ``backend = "command"`` server through ``cmd``).

The matrix is every entry of :data:`~rocmforge_supervisor.supervisor.BACKENDS` × every rule:

* memory is short: the idle neighbour goes, whatever its backend (each kind × each kind);
* a group's ``max_loaded`` swaps an idle member, ``exclusive`` clears the outsiders;
* the memory is held by a pinned or a ``swap = "never"`` model, or the group is full of members
  kept by those rules: a :class:`ResidencyConflict` (409 at the edge) at once, naming the rule;
  the model is not ``failed``, and loads once the user makes room;
* a group whose members are busy: the load waits, then swaps;
* a model that never fits: a :class:`PlacementError` naming what it needs and what the device has.

On the rx7900xtx fixture (24 GiB) two ``BIG`` models of any kinds fit side by side and a third
does not; ``SMALL`` ones always fit. Every model is placed on the fixture's GPU (``gpu = 0``), so
that this machine's own RAM does not change a decision.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from rocmforge_supervisor._errors import ModelFailed, PlacementError, ResidencyConflict
from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.supervisor import BACKENDS, EventKind, ModelState, Supervisor
from tests.support.supervised import fake_config, running, wait_state

pytestmark = pytest.mark.anyio

#: Every backend that runs a process here (a peer's models are placed on their own server).
KINDS = tuple(name for name, b in BACKENDS.items() if not b.remote)
Size = Literal["big", "small", "huge"]
_GIB = 1024**3

#: Per size: the bytes a whisper file or a command's ``memory`` is given; a llama model's context.
#: A llama BIG holds about 10.0 GiB on the GPU (its estimate), a whisper BIG its file plus
#: whisper.cpp's state (9 GiB + 0.9 + 0.125), a command BIG its 10 GiB.
_LLAMA_CTX = {"small": 2048, "big": 8_000_000, "huge": 30_000_000}
_WHISPER_FILE = {"small": 50 * 1024**2, "big": 9 * _GIB, "huge": 30 * _GIB}
_COMMAND_MEMORY = {"small": "256MiB", "big": "10GiB", "huge": "30GiB"}


def _whisper_file(path: Path, size: int) -> Path:
    """A whisper.cpp header (base's hparams) on a sparse file of ``size`` bytes."""
    if not path.exists():
        header = struct.pack("<I11i", 0x67676D6C, 51864, 1500, 512, 8, 6, 448, 512, 8, 6, 80, 1)
        with path.open("wb") as f:
            f.write(header)
            f.truncate(size)
    return path


class Models:
    """``[models.NAME]`` keys of one backend kind and size, for this test's folder."""

    def __init__(self, folder: Path, fake_bin: Path) -> None:
        self.folder, self.fake_bin = folder, fake_bin

    def llama(self, size: Size) -> dict[str, Any]:
        return {"ctx_size": _LLAMA_CTX[size], "parallel": 1, "gpu": 0}

    def whisper(self, size: Size) -> dict[str, Any]:
        path = _whisper_file(self.folder / f"ggml-{size}.bin", _WHISPER_FILE[size])
        return {"backend": "whisper", "path": str(path), "gpu": 0}

    def command(self, size: Size) -> dict[str, Any]:
        cmd = [str(self.fake_bin), "--host", "${HOST}", "--port", "${PORT}"]
        return {"backend": "command", "path": size, "cmd": cmd, "memory": _COMMAND_MEMORY[size], "gpu": 0}

    def of(self, kind: str, size: Size, **keys: Any) -> dict[str, Any]:
        make: Callable[[Size], dict[str, Any]] | None = getattr(self, kind, None)
        if make is None:
            pytest.fail(f"backend {kind!r} has no model in the residency matrix: add one to Models")
        return {**make(size), **keys}


MakeConfig = Callable[..., ForgeConfig]


@pytest.fixture
def models(tmp_path: Path, fake_bin: Path) -> Models:
    return Models(tmp_path / "files", fake_bin)


@pytest.fixture
def config(
    tmp_path: Path, tiny_gguf: Path, fake_bin: Path, monkeypatch: pytest.MonkeyPatch, models: Models
) -> MakeConfig:
    """``config({"a": keys, …}, groups=…)`` on the rx7900xtx fixture; the fake answers as the
    whisper-server too (the settings are read from the environment, as ``forge serve`` reads them)."""
    monkeypatch.setenv("FORGE_WHISPER_SERVER", str(fake_bin))
    models.folder.mkdir(exist_ok=True)

    def make(table: dict[str, dict[str, Any]], **keys: Any) -> ForgeConfig:
        return fake_config(tmp_path, tiny_gguf, table, machine="rx7900xtx", **keys)

    return make


def _other(kind: str) -> str:
    """The next kind in the table: a neighbour of another backend."""
    return KINDS[(KINDS.index(kind) + 1) % len(KINDS)]


def _evictions(sup: Supervisor) -> list[tuple[str, str]]:
    return [(e.model, str(e.data.get("rule"))) for e in sup.events.history() if e.kind == EventKind.EVICT]


def test_every_backend_has_a_model_here(models: Models) -> None:
    for kind in KINDS:
        assert callable(getattr(models, kind, None)), f"backend {kind!r} is not in the matrix"


@pytest.mark.parametrize("neighbour", KINDS)
@pytest.mark.parametrize("kind", KINDS)
async def test_an_idle_neighbour_of_any_backend_makes_room(
    config: MakeConfig, models: Models, fake_bin: Path, kind: str, neighbour: str
) -> None:
    cfg = config(
        {
            "old": models.of(neighbour, "big"),
            "mid": models.of(_other(kind), "big"),
            "new": models.of(kind, "big"),
        }
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("old")  # the least recently used of the two
        await sup.load("mid")
        await sup.load("new")
        assert [m for m, _ in _evictions(sup)] == ["old"]
        assert all(rule.startswith("memory") for _, rule in _evictions(sup))
        assert sup.get("new").state == ModelState.READY and sup.get("mid").state == ModelState.READY
        assert sup.get("old").state == ModelState.STOPPED


@pytest.mark.parametrize("kind", KINDS)
async def test_a_groups_max_loaded_swaps_a_member_of_any_backend(
    config: MakeConfig, models: Models, fake_bin: Path, kind: str
) -> None:
    cfg = config(
        {
            "x": models.of(_other(kind), "small"),
            "y": models.of(kind, "small"),
            "solo": models.of(kind, "small"),
        },
        groups={"g": {"members": ["x", "y"], "max_loaded": 1}},
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("solo")
        await sup.load("x")
        await sup.load("y")
        assert _evictions(sup) == [("x", "group 'g' has max_loaded = 1")]
        assert sup.get("solo").state == ModelState.READY


@pytest.mark.parametrize("kind", KINDS)
async def test_an_exclusive_group_clears_the_outsiders_of_any_backend(
    config: MakeConfig, models: Models, fake_bin: Path, kind: str
) -> None:
    cfg = config(
        {
            "x": models.of(kind, "small"),
            "out": models.of(_other(kind), "small"),
            "kept": models.of(_other(_other(kind)), "small", pinned=True),
        },
        groups={"solo": {"members": ["x"], "exclusive": True}},
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("out")
        await sup.load("kept")
        await sup.load("x")
        assert _evictions(sup) == [("out", "group 'solo' is exclusive")]
        assert sup.get("kept").state == ModelState.READY


async def _refused_at_once(sup: Supervisor, name: str) -> ResidencyConflict:
    started = time.monotonic()
    with pytest.raises(ResidencyConflict) as err:
        await sup.load(name)
    assert time.monotonic() - started < 1.0
    m = sup.get(name)
    assert m.state == ModelState.STOPPED and m.failure_kind is None  # refused, not failed
    assert [e.data["rule"] for e in sup.events.history(name) if e.kind == EventKind.REFUSED] == [
        err.value.rule
    ]
    return err.value


@pytest.mark.parametrize(
    ("keys", "rule"), [({"pinned": True}, "pinned"), ({"swap": "never"}, 'swap = "never"')]
)
@pytest.mark.parametrize("kind", KINDS)
async def test_memory_held_by_kept_models_is_a_conflict_naming_the_rule(
    config: MakeConfig, models: Models, fake_bin: Path, kind: str, keys: dict[str, object], rule: str
) -> None:
    cfg = config(
        {
            "a": models.of(kind, "big", **keys),
            "b": models.of(_other(kind), "big", **keys),
            "c": models.of(kind, "big"),
        }
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("a")
        await sup.load("b")
        err = await _refused_at_once(sup, "c")
        assert err.rule == rule and "more on amd:0" in err.message and "forge unload" in str(err)
        with pytest.raises(ResidencyConflict):  # a second request asks the rules again
            async with sup.acquire("c", load_wait=5):
                pass
        await sup.unload("b")  # the user makes room: now it loads, nothing else is touched
        await sup.load("c")
        assert sup.get("a").state == ModelState.READY and _evictions(sup) == []


@pytest.mark.parametrize("keep", [{"pinned": True}, {"swap": "never"}])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_group_full_of_kept_members_is_a_conflict_naming_max_loaded(
    config: MakeConfig, models: Models, fake_bin: Path, kind: str, keep: dict[str, object]
) -> None:
    cfg = config(
        {"x": models.of(_other(kind), "small", **keep), "y": models.of(kind, "small")},
        groups={"g": {"members": ["x", "y"], "max_loaded": 1}},
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("x")
        err = await _refused_at_once(sup, "y")
        assert err.rule == "group 'g' has max_loaded = 1" and "x (" in err.message
        assert sup.get("x").state == ModelState.READY


@pytest.mark.parametrize("kind", KINDS)
async def test_a_group_of_busy_members_makes_the_load_wait_then_swaps(
    config: MakeConfig, models: Models, fake_bin: Path, kind: str
) -> None:
    cfg = config(
        {"x": models.of(_other(kind), "small"), "y": models.of(kind, "small")},
        groups={"g": {"members": ["x", "y"], "max_loaded": 1}},
    )
    async with running(cfg, fake_bin) as sup:
        await sup.load("x")
        async with anyio.create_task_group() as tg:
            async with sup.acquire("x"):  # x is busy: y's load waits for it
                tg.start_soon(sup.load, "y")
                y = sup.get("y")
                with anyio.fail_after(5):
                    while not any(e.kind == EventKind.WAITING for e in sup.events.history("y")):
                        await y.changed()
                assert y.state == ModelState.LOADING and sup.get("x").state == ModelState.READY
            await wait_state(y, ModelState.READY, timeout=10)
        assert [m for m, _ in _evictions(sup)] == ["x"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_model_that_never_fits_says_what_it_needs_and_evicts_nothing(
    config: MakeConfig, models: Models, fake_bin: Path, kind: str
) -> None:
    cfg = config({"idle": models.of(_other(kind), "small"), "huge": models.of(kind, "huge")})
    async with running(cfg, fake_bin) as sup:
        await sup.load("idle")
        with pytest.raises(ModelFailed) as err:
            await sup.load("huge")
        huge = sup.get("huge")
        assert huge.failure_kind == "placement" and huge.state == ModelState.FAILED
        assert "does not fit" in err.value.message and "amd:0" in err.value.message
        assert not isinstance(err.value, PlacementError) and _evictions(sup) == []
        assert sup.get("idle").state == ModelState.READY
