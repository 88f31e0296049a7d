"""Each backend's own keys, walked from their classes (``LlamaKeys``, ``CommandKeys``): every one
of them, set on a model of another backend, is refused by name with the fix, before any rule
among one backend's keys; and the same value on its own backend is accepted. A key added to a
class without a sample value here fails the first test, so the next key is covered too."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rocmforge_supervisor.config import ModelConfig
from rocmforge_supervisor.config._command_keys import CommandKeys
from rocmforge_supervisor.config._llama_keys import LlamaKeys

#: A model of each backend, with nothing but what it needs.
BASE: dict[str, dict[str, Any]] = {
    "llama": {"path": "m.gguf"},
    "whisper": {"backend": "whisper", "path": "ggml-tiny.en.bin"},
    "command": {"backend": "command", "cmd": ["server", "--port", "${PORT}"]},
}

#: A value for each backend's keys that means something (not the key's default), and what else a
#: model of its own backend needs for it to be accepted.
SAMPLES: dict[str, tuple[Any, dict[str, Any]]] = {
    "ctx_size": (4096, {}),
    "ctx_min": (512, {"ctx_size": "auto"}),
    "gpu_layers": (10, {}),
    "parallel": (2, {}),
    "kv_unified": (False, {}),
    "sleep_idle": (60, {}),
    "embeddings": (True, {}),
    "max_tokens": (64, {}),
    "keep_context": (True, {}),
    "keep_conversations": (True, {"keep_context": True}),
    "mmproj": ("mmproj.gguf", {}),
    "mmproj_offload": (True, {}),
    "workers": ("all", {}),
    "draft": ("d.gguf", {}),
    "draft_max": (4, {"draft": "d.gguf"}),
    "draft_min": (1, {"draft": "d.gguf"}),
    "draft_gpu": ("cpu", {"draft": "d.gguf"}),
    "speculative": ("ngram-mod", {}),
    "rerank": (True, {}),
    "adapters": ({"a": {"path": "a.gguf"}}, {}),
    "cmd": (["other", "--port", "${PORT}"], {}),
    "health": ("/v1/models", {}),
    "ready_log": ("listening", {}),
    "routes": (["/v1/chat/completions"], {}),
    "memory": ("1GiB", {}),
    "env": ({"A": "1"}, {}),
}

OWNERS: dict[str, str] = {
    **{key: "llama" for key in LlamaKeys.model_fields},
    **{key: "command" for key in CommandKeys.model_fields},
}


def test_every_backend_key_has_a_sample() -> None:
    assert set(OWNERS) == set(SAMPLES), "add a sample value for each new backend key"


@pytest.mark.parametrize("key", sorted(OWNERS))
def test_a_backend_key_is_accepted_on_its_own_backend(key: str) -> None:
    value, needs = SAMPLES[key]
    model = ModelConfig.model_validate({**BASE[OWNERS[key]], **needs, key: value})
    assert getattr(model, key) != ModelConfig.model_fields[key].get_default(call_default_factory=True)


@pytest.mark.parametrize(("key", "backend"), [(k, b) for k in sorted(OWNERS) for b in BASE if b != OWNERS[k]])
def test_a_backend_key_on_another_backend_is_refused_by_name(key: str, backend: str) -> None:
    value, _ = SAMPLES[key]
    with pytest.raises(ValidationError) as caught:
        ModelConfig.model_validate({**BASE[backend], key: value})
    (error,) = caught.value.errors()
    message = str(error["msg"])
    assert key in message and "remove it" in message, message
    if OWNERS[key] == "llama":
        assert f'does not apply to a backend = "{backend}" model' in message, message
    else:
        assert 'applies only to a backend = "command" model' in message, message


#: Values that ask a server for nothing, accepted on a model of any backend (configs have always
#: said them): every key's own default, given explicitly, and these.
NOTHING: dict[str, list[Any]] = {
    "ctx_size": [0],
    "gpu_layers": [0, "auto"],
    "mmproj": ["auto"],
    "workers": ["never"],
    "routes": [[]],
}


@pytest.mark.parametrize(("key", "backend"), [(k, b) for k in sorted(OWNERS) for b in BASE if b != OWNERS[k]])
def test_a_value_that_asks_for_nothing_is_accepted_on_any_backend(key: str, backend: str) -> None:
    default = ModelConfig.model_fields[key].get_default(call_default_factory=True)
    for value in [default, *NOTHING.get(key, [])]:
        model = ModelConfig.model_validate({**BASE[backend], key: value})
        assert getattr(model, key) == value or value == "auto"  # "auto" of gpu_layers is parsed
