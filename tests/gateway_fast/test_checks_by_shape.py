"""The tools and media checks run where the body's shape calls for them (a text chat skips both:
``test_request_walk``), so a body that does send tools or images must still meet them, in every
dialect. Against the FAKE llama-server; the media check on the real server:
tests/gateway/test_multimodal.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import DIALECTS, PATHS, Dialect, error_of
from tests.support.tiny_gguf import TOOLS_TEMPLATE, write_tiny_gguf

pytestmark = pytest.mark.anyio

PNG = "iVBORw0KGgo="  # valid base64 (the PNG signature)
OPENAI_TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
}
ANTHROPIC_TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {}}}


def _with_image(dialect: Dialect, model: str) -> dict[str, Any]:
    if dialect == "ollama":
        message: dict[str, Any] = {"role": "user", "content": "what is this?", "images": [PNG]}
    elif dialect == "anthropic":
        source = {"type": "base64", "media_type": "image/png", "data": PNG}
        message = {"role": "user", "content": [{"type": "image", "source": source}]}
    else:
        part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
        message = {"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}
    return {"model": model, "messages": [message], "stream": False, "max_tokens": 3}


def _with_tools(dialect: Dialect, model: str) -> dict[str, Any]:
    tool = ANTHROPIC_TOOL if dialect == "anthropic" else OPENAI_TOOL
    hello = [{"role": "user", "content": "hi"}]
    return {"model": model, "messages": hello, "tools": [tool], "stream": False, "max_tokens": 3}


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_image_to_a_model_without_a_projector_is_refused(serve: Serve, dialect: Dialect) -> None:
    async with serve({"m": {"preload": True}}) as gw:
        r = await gw.client.post(PATHS[dialect], json=_with_image(dialect, "m"))
        assert r.status_code == 400, r.text
        message, _ = error_of(dialect, r.json())
        assert "no multimodal projector" in message and "mmproj" in message, message


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_tools_to_a_model_that_takes_none_are_refused(
    serve: Serve, tmp_path: Path, dialect: Dialect
) -> None:
    tools_gguf = write_tiny_gguf(tmp_path / "tools.gguf", chat_template=TOOLS_TEMPLATE)
    async with serve({"off": {"path": tools_gguf, "tools": False}}) as gw:
        r = await gw.client.post(PATHS[dialect], json=_with_tools(dialect, "off"))
        assert r.status_code == 400, r.text
        message, _ = error_of(dialect, r.json())
        assert "tools = false" in message, message
