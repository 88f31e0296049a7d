"""The one resolver of asked names (``X``, ``X:latest``, ``X:VARIANT``, ``X:ADAPTER``) and the one
body rewrite every dialect's request goes through (``service/_names.py``), on plain dicts."""

from __future__ import annotations

from typing import Any

from rocmforge_supervisor.access._keys import Key
from rocmforge_supervisor.config import ModelConfig
from rocmforge_supervisor.service.core._names import ServedName, rewrite, served_names, split_name

X = ModelConfig.model_validate(
    {
        "path": "x.gguf",
        "variants": {
            "json": {
                "defaults": {"temperature": 0.1, "top_k": 5},
                "force": {"response_format": {"type": "json_object"}, "max_tokens": 64},
                "strip": ["top_p", "temperature"],
                "system": "Answer in JSON.",
            },
            "tuned-json": {"adapter": "b", "force": {"max_tokens": 8}},
        },
        "adapters": {"a": {"path": "a.gguf"}, "b": {"path": "b.gguf", "scale": 0.5}},
    }
)
CONFIGS = {"x": X, "y": ModelConfig(path="y.gguf")}


def _split(asked: str) -> ServedName:
    return split_name(asked, CONFIGS, CONFIGS.__getitem__)


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "x:json", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_names_resolve_to_their_model_and_view() -> None:
    assert _split("x") == ServedName("x", "x")
    assert _split("x:latest") == ServedName("x", "x")
    json = _split("x:json")
    assert (json.asked, json.model, json.variant, json.adapter) == ("x:json", "x", X.variants["json"], None)
    assert _split("x:json:latest").asked == "x:json"
    a = _split("x:b")
    assert (a.model, a.variant, a.adapter, [n for n, _ in a.adapters]) == ("x", None, "b", ["a", "b"])
    assert _split("x:tuned-json").adapter == "b"
    # Unknown names come back as themselves: the model lookup's 404 names the known ones.
    assert _split("x:nope") == ServedName("x:nope", "x:nope")
    assert _split("y:json") == ServedName("y:json", "y:json")
    assert _split("z") == ServedName("z", "z")
    assert served_names("x", X) == ["x:json", "x:tuned-json", "x:a", "x:b"]


def test_a_variant_strips_then_defaults_then_forces_then_adds_its_system() -> None:
    body = _chat(top_p=0.9, temperature=1.5, top_k=40, max_tokens=1000)
    assert rewrite(body, _split("x:json"))
    assert "top_p" not in body
    assert body["temperature"] == 0.1  # stripped, then the default
    assert body["top_k"] == 40  # the request's own wins over a default
    assert body["max_tokens"] == 64 and body["response_format"] == {"type": "json_object"}  # forced
    assert body["messages"][0] == {"role": "system", "content": "Answer in JSON."}
    assert "lora" not in body


def test_the_requests_own_system_prompt_wins() -> None:
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}]
    body = _chat(messages=own)
    rewrite(body, _split("x:json"))
    assert body["messages"] == own
    anthropic: dict[str, Any] = {"model": "x:json", "messages": [{"role": "user", "content": "hi"}]}
    rewrite(anthropic, _split("x:json"), anthropic=True)
    assert anthropic["system"] == "Answer in JSON." and anthropic["messages"][0]["role"] == "user"
    kept: dict[str, Any] = {"model": "x:json", "system": "mine", "messages": []}
    rewrite(kept, _split("x:json"), anthropic=True)
    assert kept["system"] == "mine"
    responses: dict[str, Any] = {"model": "x:json", "input": "hi"}
    rewrite(responses, _split("x:json"))
    assert responses["instructions"] == "Answer in JSON."
    completion: dict[str, Any] = {"model": "x:json", "prompt": "hi"}
    rewrite(completion, _split("x:json"))
    assert completion["prompt"] == "hi" and "messages" not in completion  # no place for a system prompt


def test_an_adapter_name_sets_every_adapter_the_named_one_at_its_scale() -> None:
    body = _chat(lora=[{"id": 0, "scale": 1.0}])
    assert rewrite(body, _split("x:b"))
    assert body["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]  # over the request's own
    combined = _chat()
    rewrite(combined, _split("x:tuned-json"))
    assert combined["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]
    assert combined["max_tokens"] == 8


def test_the_model_itself_goes_unchanged_with_its_own_lora() -> None:
    body = _chat(model="x", lora=[{"id": 1, "scale": 0.3}], temperature=2.0)
    before = dict(body)
    assert not rewrite(body, _split("x"))
    assert body == before


def test_a_key_allowed_a_model_may_use_its_variants_not_the_other_way() -> None:
    whole = Key("k", b"s", ("x",))
    assert whole.may_use("x") and whole.may_use("x:json") and whole.may_use("x:b")
    assert not whole.may_use("y:json")
    one = Key("j", b"s", ("x:json",))
    assert one.may_use("x:json") and not one.may_use("x") and not one.may_use("x:b")
    glob = Key("g", b"s", ("x:*",))
    assert glob.may_use("x:a") and not glob.may_use("x")
