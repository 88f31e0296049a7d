"""What the service says about its models: the start line (and systemd status) counts the
preloaded models it waited for and the ones that load on a request; a misspelt variant is a 404
with "did you mean" and the model's variants; a warm default kept out by a pinned group member
says why, once."""

from __future__ import annotations

import logging

import pytest

from rocmforge_supervisor.service.ops._server import _status_line
from rocmforge_supervisor.supervisor import ModelState
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import DIALECTS, Dialect, chat, error_of
from tests.support.gateway import poll

pytestmark = pytest.mark.anyio


async def test_the_start_line_counts_preloaded_models_and_the_rest(serve: Serve) -> None:
    async with serve({"a": {"preload": True}, "b": {}, "c": {}, "d": {}}) as gw:
        assert _status_line(gw.sup) == "1 of 1 preloaded model ready; 3 more load on first request"
        path, body = chat("openai", "b", stream=False)
        assert (await gw.client.post(path, json=body)).status_code == 200
        assert _status_line(gw.sup) == (
            "1 of 1 preloaded model ready; 1 more loaded on request; 2 more load on first request"
        )
    async with serve({"a": {}, "b": {}}) as gw:
        assert _status_line(gw.sup) == "no model preloaded; 2 load on first request"
    async with serve({"a": {"preload": True}, "b": {"preload": True}}) as gw:
        assert _status_line(gw.sup) == "2 of 2 preloaded models ready"


async def test_a_failed_preload_is_named(serve: Serve) -> None:
    async with serve({"a": {"preload": True}, "bad": {"preload": True, "args": ["--fake-refuse"]}}) as gw:
        await poll(lambda: gw.model("bad").state == ModelState.FAILED, what="bad to fail")
        assert _status_line(gw.sup) == "1 of 2 preloaded models ready; failed: bad"


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_misspelt_variant_gets_did_you_mean_and_the_variants(serve: Serve, dialect: Dialect) -> None:
    variants = {"terse": {"force": {"max_tokens": 8}}, "json": {"system": "JSON."}}
    async with serve({"smollm2-135m": {"variants": variants}, "other": {}}) as gw:
        path, body = chat(dialect, "smollm2-135m:tersee", stream=False)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 404, r.text
        message, _ = error_of(dialect, r.json())
        assert "did you mean 'smollm2-135m:terse'?" in message, message
        assert "smollm2-135m:terse, smollm2-135m:json" in message, message
        assert "\n" not in message

        # a misspelt model: the closest name
        path, body = chat(dialect, "smollm2-135", stream=False)
        message, _ = error_of(dialect, (await gw.client.post(path, json=body)).json())
        assert "did you mean 'smollm2-135m'?" in message, message

        # a model without variants says how to add one
        path, body = chat(dialect, "other:terse", stream=False)
        message, _ = error_of(dialect, (await gw.client.post(path, json=body)).json())
        assert "no variants" in message and "[models.other.variants.terse]" in message, message


async def test_a_warm_default_kept_out_by_a_pinned_member_says_why_once(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="rocmforge")
    models = {"p": {"pinned": True, "preload": True}, "w": {"default": True}}
    async with serve(models, groups={"g": {"members": ["p", "w"], "max_loaded": 1}}) as gw:

        def said() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.levelno >= logging.INFO
                and r.getMessage().startswith("model w:")
                and "warm" in r.getMessage()
            ]

        await poll(said, what="the warm default's reason")
        assert gw.model("w").state in (ModelState.STOPPED, ModelState.UNLOADED)
        gw.sup._try_warm()  # tried again (after another model stops, every 30 s): not said again
        await poll(lambda: not gw.model("w").running, what="the second try to end")
        (line,) = said()
        assert "group 'g' has max_loaded = 1" in line and "p (pinned)" in line, line
