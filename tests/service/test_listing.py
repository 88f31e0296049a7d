"""The model facts every listing shares (``service/proxy/_listing.py``), against the fake llama-server
(tests/support/fake_llama_server.py, a FAKE: its ``/props`` answers ``build_info: fake``). The real
llama-server's ``/props`` is read through them in tests/gateway/test_ollama.py and test_serve.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest

from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.service.proxy._listing import ModelFacts
from tests.supervisor import conftest as supervised
from tests.support.supervised import running

pytestmark = pytest.mark.anyio

make_config = supervised.make_config  # the supervisor tests' fixture: configs on a fixture machine


async def test_props_is_read_without_taking_a_request_slot(
    make_config: Callable[..., ForgeConfig],
    fake_bin: Path,
) -> None:
    cfg = make_config({"a": {"parallel": 1}})
    async with running(cfg, fake_bin) as sup, httpx.AsyncClient() as client:
        facts = ModelFacts(sup, client, resolve_path=lambda _ref: None)
        assert await facts.props("a") is None  # not loaded: nothing to ask, nothing started
        await sup.load("a")
        async with sup.acquire("a", load_wait=5):  # the model's only slot, held by a request
            with anyio.fail_after(5):
                props = await facts.props("a")
        assert props is not None and props["build_info"] == "fake"
        first = sup.view("a").child
        assert first is not None and first.pid is not None
        await sup.unload("a")
        assert await facts.props("a") is None  # its child is gone
        await sup.load("a")
        second = sup.view("a").child
        assert second is not None and second.pid != first.pid
        with anyio.fail_after(5):
            assert await facts.props("a") == props  # read again from the new child
        assert facts._props["a"][0] == second.pid  # cached per child process
