"""The status page for every kind of model in the backends table, in a real headless chromium
against a real `forge serve` whose children are all the FAKE llama-server (as llama-server, as
whisper-server through ``FORGE_WHISPER_SERVER``, and as a ``backend = "command"`` server through
``cmd``): each row names its kind as the table does and the requests it answers, as
``/api/models`` says; Try it offers every name that answers chat (a variant and an adapter of a
llama model, a command) and no other (the speech model, a command that only embeds).

What a model answers (its status's ``serves``) is checked first for each way a config decides it,
on the supervisor in-process (the fake again)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from rocmforge_supervisor.supervisor import BACKENDS
from rocmforge_supervisor.supervisor.model._status import ROUTE_WORDS
from tests.support.browser import chromium, model_row, row_state, severe_console_errors, wait_until
from tests.support.fake_peer import FakePeer
from tests.support.lora import write_lora
from tests.support.service import FAST, running_service, write_config
from tests.support.supervised import fake_config, running
from tests.support.tiny_clip import write_tiny_audio_clip

#: One model of each backend (the key), the row's name for it.
ROW = {"llama": "smol", "whisper": "stt", "command": "echo", "peer": "far"}
#: What each model answers, as /api/models says and the row shows.
SERVES = {
    "smol": ["chat", "completion"],
    "stt": ["transcription"],
    "echo": ["chat", "completion", "embeddings"],
    "vectors": ["embeddings"],
    "far": ["chat", "completion", "embeddings"],
}


def _whisper_file(path: Path) -> Path:
    """A whisper.cpp header (base's hparams) on a small file: what planning reads of a model."""
    header = struct.pack("<I11i", 0x67676D6C, 51864, 1500, 512, 8, 6, 448, 512, 8, 6, 80, 1)
    with path.open("wb") as f:
        f.write(header)
        f.truncate(1 << 20)
    return path


def _config(tmp_path: Path, tiny_gguf: Path, fake_bin: Path, peer_url: str) -> Path:
    lora = write_lora(tmp_path / "tuned.gguf", tiny_gguf, targets=("attn_q",))
    stt = _whisper_file(tmp_path / "ggml-base.bin")
    cmd = f'cmd = ["{fake_bin}", "--host", "${{HOST}}", "--port", "${{PORT}}"]\n'
    return write_config(
        tmp_path / "forge.toml",
        FAST
        + f'[models.smol]\npath = "{tiny_gguf}"\ngpu = "cpu"\nctx_size = 512\nparallel = 1\npreload = true\n'
        + '[models.smol.variants.terse]\nsystem = "Answer in one word."\n'
        + f'[models.smol.adapters.tuned]\npath = "{lora}"\n'
        + f'[models.stt]\npath = "{stt}"\nbackend = "whisper"\ngpu = "cpu"\npreload = true\n'
        + f'[models.echo]\nbackend = "command"\n{cmd}gpu = "cpu"\npreload = true\n'
        + f'[models.vectors]\nbackend = "command"\n{cmd}routes = ["/v1/embeddings"]\ngpu = "cpu"\n'
        + f'[peers.box]\nurl = "{peer_url}"\nmodels = ["far"]\n',
    )


def _chat_models(d: WebDriver) -> list[str]:
    return [str(o.get_attribute("value")) for o in d.find_elements(By.CSS_SELECTOR, "#chat-model option")]


def _text(d: WebDriver, name: str, selector: str) -> str:
    # textContent: the kind line is shown upper-case by the CSS.
    return str(model_row(d, name).find_element(By.CSS_SELECTOR, selector).get_attribute("textContent"))


def _ask(d: WebDriver, model: str, prompt: str) -> str:
    """Send ``prompt`` to ``model`` from Try it; the reply it shows once streamed."""
    d.find_element(By.CSS_SELECTOR, f'#chat-model option[value="{model}"]').click()
    before = len(d.find_elements(By.CSS_SELECTOR, "#chat-log li.assistant"))
    d.find_element(By.ID, "chat-prompt").send_keys(prompt)
    d.find_element(By.ID, "chat-send").click()

    def reply(d: WebDriver) -> str | None:
        done = d.find_elements(By.CSS_SELECTOR, "#chat-log li.assistant:not(.streaming) .text")
        return str(done[-1].text) if len(done) == before + 1 else None

    return str(wait_until(d, reply, f"the reply of {model}"))


def _fake_whisper(tmp_path: Path) -> dict[str, object]:
    return {"backend": "whisper", "path": str(_whisper_file(tmp_path / "ggml-base.bin"))}


def _fake_command(fake_bin: Path, **keys: object) -> dict[str, object]:
    return {"backend": "command", "cmd": [str(fake_bin), "--host", "${HOST}", "--port", "${PORT}"], **keys}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "serves"),
    [
        ("chat", ["chat", "completion"]),
        ("embeddings = true", ["chat", "completion", "embeddings"]),
        ("--embeddings in args", ["chat", "completion", "embeddings"]),
        ("rerank = true", ["rerank"]),
        ("an audio projector", ["chat", "completion", "transcription"]),
        ("whisper", ["transcription"]),
        ("a command", ["chat", "completion", "embeddings"]),
        ("a command's routes", ["embeddings", "rerank"]),
    ],
)
async def test_what_a_model_answers_follows_its_backend_and_keys(
    kind: str,
    serves: list[str],
    tmp_path: Path,
    tiny_gguf: Path,
    fake_bin: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORGE_WHISPER_SERVER", str(fake_bin))
    keys: dict[str, object] = {
        "chat": {},
        "embeddings = true": {"embeddings": True},
        "--embeddings in args": {"args": ["--embeddings"]},
        "rerank = true": {"rerank": True},
        "an audio projector": {"mmproj": str(write_tiny_audio_clip(tmp_path / "mmproj-hearing.gguf"))},
        "whisper": _fake_whisper(tmp_path),
        "a command": _fake_command(fake_bin),
        "a command's routes": _fake_command(fake_bin, routes=["/v1/rerank", "/v1/embeddings"]),
    }[kind]
    cfg = fake_config(tmp_path, tiny_gguf, {"m": {**keys, "preload": True}})
    async with running(cfg, fake_bin) as sup:
        row = sup.get("m").status().to_json()
    assert row["serves"] == serves and set(serves) <= set(ROUTE_WORDS)
    assert row["label"] == BACKENDS[row["backend"]].label


def test_each_backend_is_named_by_the_table_and_try_it_offers_what_answers_chat(
    tmp_path: Path, tiny_gguf: Path, fake_bin: Path
) -> None:
    assert set(ROW) == set(BACKENDS), "every backend needs a model in this test: add it to ROW and the config"
    env = {"FORGE_WHISPER_SERVER": str(fake_bin)}
    with (
        FakePeer(api="openai", models=["far"]) as peer,
        running_service(
            _config(tmp_path, tiny_gguf, fake_bin, peer.url), tmp_path / "state", fake_bin, extra_env=env
        ) as svc,
        chromium(tmp_path / "profile") as d,
    ):
        rows = svc.models()
        for name, row in rows.items():  # the API carries the kind's label and what it answers
            assert row["label"] == BACKENDS[row["backend"]].label, name
            assert row["serves"] == SERVES[name], name
        assert rows["smol"]["variants"] == ["smol:terse"] and rows["smol"]["adapters"] == ["smol:tuned"]

        d.get(svc.url + "/")
        for backend, name in ROW.items():
            wait_until(d, lambda d, name=name: row_state(d, name) == "ready", f"the {name} row ready")
            label = BACKENDS[backend].label
            assert _text(d, name, ".modalities") == label, backend
            assert _text(d, name, ".serves") == "answers " + " · ".join(SERVES[name]), backend
        assert _text(d, "vectors", ".modalities") == BACKENDS["command"].label
        assert _text(d, "vectors", ".serves") == "answers embeddings"

        chat = ["smol", "smol:terse", "smol:tuned", "echo", "far"]
        wait_until(d, lambda d: _chat_models(d) == chat, "the chat names in Try it")
        assert _ask(d, "echo", "hello command")  # a command model answers from Try it
        assert _ask(d, "smol:terse", "hello variant")  # and so does a variant, through its parent
        assert _ask(d, "far", "hello peer") == "echo from far: hello peer"  # and a peer's model
        with svc.client() as c:
            served = {r["name"]: r["requests_total"] for r in c.get("/api/models").json()["models"]}
        assert served["echo"] == 1 and served["smol"] == 1
        assert d.find_elements(By.CSS_SELECTOR, "#chat-log .error") == []
        assert severe_console_errors(d) == []
