"""Images through `forge serve`: a model with a projector takes them in every dialect; the rest is
refused with a 400 that says why — a model without one, a malformed image, and remote or local
URLs (a server-side request forgery surface: llama-server would fetch them itself).

One real service (module-scoped, both models preloaded) runs the tiny text model twice on the real
llama-server: ``vision`` with ``mmproj = "auto"`` (the random-weight CLIP projector the tests
write, found beside the model), ``hearing`` with a random-weight audio projector (Ultravox's
layout) given by path, ``text`` without (and ``lazy``, ``vision`` never loaded). The weights are random: what is checked is that
an image reaches the child as an image (it costs 16 prompt tokens more than the text alone), not
what the model says about it.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.service import Service, model_section, running_service, wait_for, write_config
from tests.support.tiny_clip import (
    AUDIO_TOKENS,
    IMAGE_TOKENS,
    png_base64,
    png_bytes,
    wav_bytes,
    write_tiny_audio_clip,
)

KEY = "sk-test-multimodal"
PROMPT = "what is on the picture"


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, vision_model: Path
) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("multimodal")
    config = write_config(
        d / "forge.toml",
        f'[server]\napi_key = "{KEY}"\n'
        + model_section("vision", vision_model, mmproj="auto", parallel=1, preload=True)
        + model_section("text", vision_model, parallel=1, preload=True)
        + model_section("lazy", vision_model, mmproj="auto", parallel=1)
        + model_section(
            "hearing",
            vision_model,
            mmproj=str(write_tiny_audio_clip(d / "audio-projector.gguf")),
            parallel=1,
            preload=True,
        ),
    )
    with running_service(config, d / "state", llama_server_bin, api_key=KEY) as s:
        yield s


def _http(svc: Service) -> httpx.Client:
    return httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


def _chat(svc: Service, model: str, content: Any) -> httpx.Response:
    with _http(svc) as c:
        return c.post(
            "/v1/chat/completions",
            json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": content}]},
        )


def _image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _with_image(url: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": PROMPT}, _image_part(url)]


class _Hits(BaseHTTPRequestHandler):
    """A local image server that counts its requests (a child fetching a URL shows up here)."""

    hits: list[str]

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = png_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def _image_server() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    handler = type("Handler", (_Hits,), {"hits": hits})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/cat.png", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- the image reaches the model ---------------------------------------------------------------------


def test_openai_sdk_image_costs_the_projector_s_tokens(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key=KEY, max_retries=0))
    plain = client.chat.completions.create(
        model="vision", max_tokens=2, messages=[{"role": "user", "content": PROMPT}]
    )
    seen = client.chat.completions.create(
        model="vision",
        max_tokens=2,
        messages=[{"role": "user", "content": _with_image(f"data:image/png;base64,{png_base64()}")}],  # type: ignore[misc]
    )
    assert plain.usage is not None and seen.usage is not None
    assert seen.usage.prompt_tokens >= plain.usage.prompt_tokens + IMAGE_TOKENS


def test_anthropic_sdk_image_block_reaches_the_child(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key=KEY, max_retries=0))
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png_base64()}}
    plain = client.messages.create(
        model="vision", max_tokens=2, messages=[{"role": "user", "content": PROMPT}]
    )
    seen = client.messages.create(
        model="vision",
        max_tokens=2,
        messages=[{"role": "user", "content": [{"type": "text", "text": PROMPT}, image]}],  # type: ignore[list-item]
    )
    assert seen.type == "message"

    def prompt(u: anthropic.types.Usage) -> int:  # llama-server counts the cached prefix apart
        return u.input_tokens + (u.cache_read_input_tokens or 0)

    assert prompt(seen.usage) >= prompt(plain.usage) + IMAGE_TOKENS


def test_ollama_client_images_reach_the_child(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(ollama.Client(host=svc.url, headers={"Authorization": f"Bearer {KEY}"}))
    plain = client.chat(
        model="vision", messages=[{"role": "user", "content": PROMPT}], options={"num_predict": 2}
    )
    seen = client.chat(
        model="vision",
        messages=[{"role": "user", "content": PROMPT, "images": [png_bytes()]}],
        options={"num_predict": 2},
    )
    assert plain.prompt_eval_count is not None and seen.prompt_eval_count is not None
    assert seen.prompt_eval_count >= plain.prompt_eval_count + IMAGE_TOKENS
    gen = client.generate(model="vision", prompt=PROMPT, images=[png_bytes()], options={"num_predict": 2})
    assert (
        gen.prompt_eval_count is not None and gen.prompt_eval_count >= plain.prompt_eval_count + IMAGE_TOKENS
    )


def test_audio_reaches_a_model_with_an_audio_projector(svc: Service, closing: ExitStack) -> None:
    audio = base64.b64encode(wav_bytes()).decode()
    with _http(svc) as c:
        plain = _chat(svc, "hearing", PROMPT).json()
        heard = _chat(
            svc,
            "hearing",
            [
                {"type": "text", "text": PROMPT},
                {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}},
            ],
        )
        assert heard.status_code == 200, heard.text
        assert heard.json()["usage"]["prompt_tokens"] >= plain["usage"]["prompt_tokens"] + AUDIO_TOKENS
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert "audio" in models["hearing"]["capabilities"] and "vision" not in models["hearing"]["capabilities"]
    assert svc.model("hearing")["modalities"] == ["audio"]
    client = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key=KEY, max_retries=0))
    text = client.audio.transcriptions.create(
        model="hearing", file=("tone.wav", wav_bytes()), extra_body={"max_tokens": "4"}
    )
    assert text.text.strip()
    # An image to the audio-only model: llama-server's own refusal, a 400 that names the key.
    r = _chat(svc, "hearing", _with_image(f"data:image/png;base64,{png_base64()}"))
    assert r.status_code == 400 and "mmproj" in r.json()["error"]["message"]


# -- what clients are told up front ------------------------------------------------------------------


def test_capabilities_say_vision_for_the_model_with_a_projector(svc: Service, closing: ExitStack) -> None:
    with _http(svc) as c:
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        tags = {m["name"]: m for m in c.get("/api/tags").json()["models"]}
    assert "vision" in models["vision"]["capabilities"] and "completion" in models["vision"]["capabilities"]
    assert "vision" not in models["text"]["capabilities"]
    # Not loaded yet: the projector file says what the child's /props will.
    assert models["lazy"]["state"] == "unloaded" and "vision" in models["lazy"]["capabilities"]
    assert "vision" in tags["vision"]["capabilities"] and "vision" not in tags["text"]["capabilities"]
    client = closing.enter_context(ollama.Client(host=svc.url, headers={"Authorization": f"Bearer {KEY}"}))
    shown = client.show("vision")
    assert shown.capabilities is not None and {"completion", "vision"} <= set(shown.capabilities)
    text = client.show("text")
    assert text.capabilities is not None and "vision" not in text.capabilities
    with _http(svc) as c:  # the ollama client does not model projector_info: read it raw
        raw = c.post("/api/show", json={"model": "vision"}).json()
        raw_text = c.post("/api/show", json={"model": "text"}).json()
    assert raw["projector_info"]["general.architecture"] == "clip"
    assert raw["projector_info"]["clip.has_vision_encoder"] is True
    assert raw["projector_info"]["clip.vision.image_size"] == 32
    assert "projector_info" not in raw_text


def test_status_counts_the_projector_and_says_what_the_model_takes(svc: Service, vision_model: Path) -> None:
    vision, text = svc.model("vision"), svc.model("text")
    assert vision["modalities"] == ["vision"] and text["modalities"] == []
    # Same GGUF, context and slots: what the vision child holds beyond the text one is its projector,
    # in the estimate and in what the child itself reported (its mtmd allocation lines).
    projector = vision_model.with_name("mmproj-tiny-vision.gguf")
    assert vision["memory"]["estimated_bytes"]["cpu"] > text["memory"]["estimated_bytes"]["cpu"]
    extra = vision["memory"]["actual_bytes"]["cpu"] - text["memory"]["actual_bytes"]["cpu"]
    assert 0.5 * projector.stat().st_size < extra < 4 * projector.stat().st_size
    argv = {tuple(p.cmdline()) for p in svc.llama_children()}
    with_projector = [a for a in argv if str(projector) in a]
    assert len(with_projector) == 1 and with_projector[0][with_projector[0].index("--mmproj") + 1] == str(
        projector
    )
    assert "--no-mmproj-offload" in with_projector[0]  # the model is on the CPU: so is its projector
    assert len([a for a in argv if "--mmproj" in a]) == 2  # vision and hearing; text has none


# -- refused with a 400 that says why ----------------------------------------------------------------


def test_an_image_to_a_model_without_a_projector_names_the_key(svc: Service, closing: ExitStack) -> None:
    r = _chat(svc, "text", _with_image(f"data:image/png;base64,{png_base64()}"))
    assert r.status_code == 400
    err = r.json()["error"]
    assert "'text'" in err["message"] and "no multimodal projector" in err["message"]
    assert 'mmproj = "auto"' in err["message"] and "[models.text]" in err["message"]
    client = closing.enter_context(ollama.Client(host=svc.url, headers={"Authorization": f"Bearer {KEY}"}))
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat(model="text", messages=[{"role": "user", "content": PROMPT, "images": [png_bytes()]}])
    assert exc.value.status_code == 400 and "mmproj" in exc.value.error


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("data:image/png;base64,@@not base64@@", "not valid base64"),
        ("data:image/png;base64", "malformed data URL"),
        ("data:text/plain;base64,aGVsbG8=", "is not a base64 image"),
        ("file:///etc/passwd", "file:// URLs are refused"),
        ("", "the image is empty"),
    ],
)
def test_malformed_and_local_images_are_400s_naming_the_part(svc: Service, url: str, says: str) -> None:
    r = _chat(svc, "vision", _with_image(url))
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert says in message and "messages[0].content[1]" in message


def test_bytes_that_are_not_an_image_are_a_400_and_the_child_survives(svc: Service) -> None:
    junk = base64.b64encode(b"this is not a picture at all" * 10).decode()
    r = _chat(svc, "vision", _with_image(f"data:image/png;base64,{junk}"))
    assert r.status_code == 400 and "image" in r.json()["error"]["message"].lower()
    assert _chat(svc, "vision", _with_image(f"data:image/png;base64,{png_base64()}")).status_code == 200
    assert svc.model("vision")["restarts"] == 0


def test_remote_image_urls_are_refused_and_never_fetched(svc: Service, closing: ExitStack) -> None:
    with _image_server() as (url, hits):
        r = _chat(svc, "vision", _with_image(url))
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert "remote image URLs are refused" in message and "allow_remote_media = true" in message
        client = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key=KEY, max_retries=0))
        with pytest.raises(anthropic.BadRequestError) as exc:
            client.messages.create(
                model="vision",
                max_tokens=2,
                messages=[
                    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}}]}
                ],  # type: ignore[list-item,typeddict-item]
            )
        assert "allow_remote_media" in str(exc.value)
        with _http(svc) as c:
            responses = c.post(
                "/v1/responses",
                json={
                    "model": "vision",
                    "max_output_tokens": 2,
                    "input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}],
                },
            )
        assert responses.status_code == 400 and "allow_remote_media" in responses.text
    assert hits == []


def test_allow_remote_media_lets_the_child_fetch_the_url(
    tmp_path: Path, llama_server_bin: Path, vision_model: Path
) -> None:
    config = write_config(
        tmp_path / "forge.toml",
        "[server]\nallow_remote_media = true\n"
        + model_section("vision", vision_model, mmproj="auto", parallel=1, preload=True),
    )
    with running_service(config, tmp_path / "state", llama_server_bin) as s, _image_server() as (url, hits):
        with httpx.Client(base_url=s.url, timeout=60) as c:
            body = {"model": "vision", "max_tokens": 2}
            plain = c.post(
                "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": PROMPT}]}
            )
            seen = c.post(
                "/v1/chat/completions",
                json={**body, "messages": [{"role": "user", "content": _with_image(url)}]},
            )
        assert seen.status_code == 200, seen.text
        assert hits == ["/cat.png"]
        assert seen.json()["usage"]["prompt_tokens"] >= plain.json()["usage"]["prompt_tokens"] + IMAGE_TOKENS


def test_media_that_crashes_the_child_is_a_clear_crash_and_the_next_request_works(
    tmp_path: Path, llama_server_bin: Path, vision_model: Path
) -> None:
    """A projector that loads but aborts on its first input (a real mtmd abort, not a fake; see
    ``write_tiny_audio_clip(stack=8)``): the request ends, the crash is named, the model comes back."""
    crashing = write_tiny_audio_clip(tmp_path / "mmproj-aborts.gguf", stack=8)
    config = write_config(
        tmp_path / "forge.toml",
        model_section("crashy", vision_model, mmproj=str(crashing), parallel=1, preload=True),
    )
    audio = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav_bytes()).decode(), "format": "wav"},
    }
    with running_service(config, tmp_path / "state", llama_server_bin) as s, s.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": "crashy", "max_tokens": 2, "messages": [{"role": "user", "content": [audio]}]},
        )
        assert r.status_code == 503 and "crashy" in r.json()["error"]["message"]
        # Not replayed (the request is what crashed it): the crash is named, as the present error
        # or, once the replacement is up, as the last crash.
        crash = wait_for(
            lambda: (m := s.model("crashy"))["restarts"] >= 1 and (m["last_error"] or m["last_crash"]),
            timeout=30,
            what="the crash recorded",
        )
        assert "SIGABRT" in crash
        text = {"model": "crashy", "max_tokens": 2, "messages": [{"role": "user", "content": PROMPT}]}
        wait_for(
            lambda: c.post("/v1/chat/completions", json=text).status_code == 200, timeout=60, what="recovery"
        )
        assert s.model("crashy")["last_error"] is None
