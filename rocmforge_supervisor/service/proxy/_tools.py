"""A request with ``tools`` to a model that cannot use them: refused with a 400, not forwarded.

llama-server renders tools into the prompt through the model's jinja chat template. A template
that never mentions ``tools`` (SmolLM2's, the default model's) renders the prompt without them —
the same prompt tokens with and without — and the request is answered as if none were sent: the
client (Claude Code sends tools on every request) gets plain text and an invented answer, with
nothing to say why. A model run without jinja (a GGUF with no template: forge starts it with
``--no-jinja``) is refused by llama-server itself, but only once it is loaded.

The choice is a 400 in the route's dialect (OpenAI, Anthropic, Ollama — the one error map shapes
it), naming the model and what to use instead, rather than a warning header: no SDK and no agent
shows a response header to its user, so a header would leave the silent wrong answer as it is,
while a 400 is shown, and SDKs do not retry it. The test is the one ``/v1/models`` and
``/api/show`` report as the ``tools`` capability (:func:`~._model_card.capabilities`), so what
a client is told up front and what a request meets are the same. ``tool_choice: "none"`` asks
for no tool call, so it passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._errors import RequestRejected
from ._model_card import ModelCard, capabilities

__all__ = ["TOOL_MODEL", "asks_for_tools", "refuse_unusable_tools"]

#: A small model whose chat template handles tools (llama.cpp parses its Hermes-style tool calls):
#: what the error and the README suggest for Claude Code and other tool-calling clients.
TOOL_MODEL = "hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M"


def asks_for_tools(payload: Mapping[str, Any]) -> bool:
    """Whether the body sends tools the model may call (a non-empty ``tools``, and no
    ``tool_choice`` of none in OpenAI's ``"none"`` or Anthropic's ``{"type": "none"}`` form)."""
    tools = payload.get("tools")
    if not isinstance(tools, list) or not tools:
        return False
    choice = payload.get("tool_choice")
    none = choice == "none" or (isinstance(choice, Mapping) and choice.get("type") == "none")
    return not none


def refuse_unusable_tools(
    name: str,
    payload: Mapping[str, Any],
    card: ModelCard | None,
    args: list[str],
    *,
    tools: bool | None = None,
    rerank: bool = False,
    configured: bool = False,
) -> None:
    """Raise a 400 (:class:`RequestRejected`) when ``payload`` sends tools that model ``name``
    would drop. ``card`` None (a hub model not fetched yet): nothing known, llama-server decides.
    ``tools``/``rerank``: as :func:`~._model_card.capabilities` takes them (what the listings say);
    ``configured``: ``tools`` is the model's own key (the error then names it)."""
    if card is None or rerank or not asks_for_tools(payload):
        return  # a reranker takes no chat at all: the route check answers that (``_rerank``)
    if "tools" in capabilities(card, args, tools=tools, rerank=rerank):
        return
    if configured and tools is False and not rerank:
        raise RequestRejected(
            f"model {name!r} does not take tools: its [models.{name}] has tools = false",
            hint="send the request without tools, or remove tools = false from the model",
            status_code=400,
            error_type="invalid_request_error",
        )
    if "--no-jinja" in args:
        why = "runs without a jinja chat template (its GGUF has none), so llama-server cannot render tools"
    else:
        why = (
            "has a chat template without tool support: llama-server would leave the tools out of "
            "the prompt and the model would answer as if none were sent"
        )
    raise RequestRejected(
        f"model {name!r} cannot call tools: it {why}",
        hint=(
            "send the request without tools, or serve a model whose chat template handles them "
            f"(e.g. path = {TOOL_MODEL!r}); GET /v1/models lists 'tools' in a model's capabilities"
        ),
        status_code=400,
        error_type="invalid_request_error",
    )
