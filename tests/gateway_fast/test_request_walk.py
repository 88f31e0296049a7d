"""What a plain chat walks through (issue 32): ``scripts/audit/request_walk.py``'s walk, kept from
growing back. A text chat sends no tools and no images, names no reranker and did not draft, so the
modules of those checks are not entered for it; and no request builds a model's whole status view
(its placement, its saved contexts) on its way to the child. Against the FAKE llama-server."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.gateway_fast.dialects import DIALECTS, Dialect

pytestmark = pytest.mark.anyio

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "audit" / "request_walk.py"

#: Modules that concern other requests than a text chat, or the status page: none is entered.
_NOT_ON_A_CHAT = {
    "service/proxy/_tools.py",  # a body that sends tools
    "service/proxy/_listing.py",  # the model listings (and the tools/media checks' model facts)
    "service/proxy/_media.py",  # a body with image/audio parts
    "service/proxy/_rerank.py",  # a reranker's routes: checked once per configuration
    "supervisor/_backends.py",  # the same route check
    "service/core/_drafting.py",  # an answer that drafted
    "supervisor/_view.py",  # a model's whole view (status, placement)
    "supervisor/_status.py",
    "config/_schema.py",  # a config property worked out again per request
    "supervisor/_loading.py",  # the wait for a model that is still loading
}


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("request_walk", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_text_chat_enters_only_what_it_needs(dialect: Dialect, stream: bool) -> None:
    order, _ = await _script().walk(dialect, stream)
    assert order, "the walk saw none of the package's modules"
    assert not _NOT_ON_A_CHAT & set(order), order
    # OpenAI and Anthropic go through no translation: 19 modules, 20 with the streams' own client
    # (29 and 38 before issue 32); Ollama's translation adds its API, converter and SSE decoder.
    limit = (20 if stream else 19) + (3 if dialect == "ollama" else 0)
    assert len(order) <= limit, order
