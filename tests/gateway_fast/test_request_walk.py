"""What a plain chat walks through: ``scripts/audit/request_walk.py``'s walk, kept from
growing back. A text chat sends no tools and no images, names no reranker and did not draft, so the
modules of those checks are not entered for it; and no request builds a model's whole status view
(its placement, its saved contexts) on its way to the child. Against the FAKE llama-server."""

from __future__ import annotations

import importlib.util
import sys
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
    "supervisor/backends/_backends.py",  # the same route check
    "service/core/_drafting.py",  # an answer that drafted
    "supervisor/_view.py",  # a model's whole view (status, placement)
    "supervisor/model/_status.py",
    "config/_schema.py",  # a config property worked out again per request
    "supervisor/model/_loading.py",  # the wait for a model that is still loading
}


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("request_walk", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("request_walk", module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_text_chat_enters_only_what_it_needs(dialect: Dialect, stream: bool) -> None:
    walk = await _script().walk(dialect, stream)
    assert walk.order, "the walk saw none of the package's modules"
    assert not _NOT_ON_A_CHAT & set(walk.order), walk.order
    # Nothing calls back up into a module still on the walk's stack (6032c7c: the forwarder
    # read the body through the middleware, the relay sent through the middleware's wrapper, and
    # Ollama's translator pulled the forwarder's iterator).
    assert walk.reentered == [], walk.reentered
    # Every dialect is prepared by the one ingress, then its own adapter (``_forward``'s for
    # OpenAI and Anthropic, ``ollama/_api``'s for Ollama).
    assert "service/proxy/_ingress.py" in walk.order, walk.order
    adapter = "service/ollama/_api.py" if dialect == "ollama" else "service/proxy/_forward.py"
    assert walk.order.index("service/proxy/_ingress.py") < walk.order.index(adapter), walk.order
    # OpenAI and Anthropic go through no translation: 20 modules, 21 with the streams' own client
    # (21 and 29 at 6032c7c, by this script; three more since a model's admission, the forwarder
    # and the ingress have modules of their own: supervisor/model/_acquire.py,
    # proxy/_forwarder.py, proxy/_ingress.py); Ollama's translation adds its converter and SSE
    # decoder, and its API in place of _forward.py (31 and 30 at 6032c7c).
    limit = (21 if stream else 20) + (2 if dialect == "ollama" else 0)
    assert len(walk.order) <= limit, walk.order


async def test_the_walk_sees_a_call_back_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a body limit asked of a function that is the middleware's (its
    code says it lives in ``edge/_middleware.py``) is a call back up into the middleware, which
    is on the stack below the forwarder."""
    from rocmforge_supervisor.service.edge import _middleware
    from rocmforge_supervisor.service.proxy import _ingress

    real = _ingress.body_limit

    def body_limit(st: object, path: str) -> int:
        return real(st, path)  # type: ignore[arg-type]

    body_limit.__code__ = body_limit.__code__.replace(co_filename=_middleware.__file__)
    monkeypatch.setattr(_ingress, "body_limit", body_limit)
    walk = await _script().walk("openai", False)
    assert any(
        r.startswith("service/edge/_middleware.py:body_limit <- service/proxy/_ingress.py")
        for r in walk.reentered
    ), walk
