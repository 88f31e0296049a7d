"""The read-only view the gateway reads of each model (:class:`ModelView`), against the fake
llama-server: what it says before a start, while ready, and after a stop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ModelNotFound
from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.supervisor import ModelState
from tests.support.supervised import running

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]


async def test_a_view_follows_the_model_and_cannot_change_it(make_config: MakeConfig, fake_bin: Path) -> None:
    cfg = make_config({"a": {"ctx_size": 2048, "parallel": 2, "max_tokens": 64, "args": ["--no-warmup"]}})
    async with running(cfg, fake_bin) as sup:
        before = sup.view("a")
        assert before.state == ModelState.UNLOADED and not before.ready
        assert before.child is None and before.answering is None and not before.started
        assert (before.ctx_size, before.parallel, before.model_path) == (None, None, None)
        assert before.args == ("--no-warmup",)  # as configured until a child is started
        assert before.config.max_tokens == 64 and dict(before.held_bytes) == {}
        with pytest.raises(dataclasses.FrozenInstanceError):
            before.state = ModelState.READY  # type: ignore[misc]

        await sup.load("a")
        ready = sup.view("a")
        assert ready.state == ModelState.READY and ready.ready and ready.started
        assert ready.child is not None and ready.answering == ready.child
        assert ready.child.pid == ready.status.pid and ready.child.base_url.startswith("http://")
        assert (ready.ctx_size, ready.parallel) == (2048, 2)
        assert "--no-warmup" in ready.args and ready.model_path is not None
        assert ready.held_bytes and all(n > 0 for n in ready.held_bytes.values())
        assert [v.name for v in sup.views()] == sup.names() == ["a"]

        await sup.unload("a")
        stopped = sup.view("a")
        assert stopped.state == ModelState.STOPPED and stopped.child is None
        assert dict(stopped.held_bytes) == {}  # a stopped model holds nothing, whatever its plan said
        assert ready.state == ModelState.READY  # an earlier view is a snapshot, not a live object

        with pytest.raises(ModelNotFound, match="'b' is not configured"):
            sup.view("b")
