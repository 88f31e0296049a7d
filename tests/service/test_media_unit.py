"""The gateway's media check (service/proxy/_media.py) on every dialect's shape, without a server: which
parts are found, and which URLs pass. The same check on the real server: tests/gateway/test_multimodal.py."""

from __future__ import annotations

from typing import Any

import pytest

from rocmforge_supervisor._errors import RequestRejected
from rocmforge_supervisor.service.proxy._media import media_parts, refuse_unusable_media
from rocmforge_supervisor.service.proxy._validate import has_parts

PNG = "iVBORw0KGgo="  # valid base64 (the PNG signature)


def _msg(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]}


def test_parts_are_found_in_every_dialect() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "text only"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}},
                    {"type": "input_audio", "input_audio": {"data": PNG, "format": "wav"}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.org/a.png"}},
                    {
                        "type": "tool_result",
                        "content": [{"type": "image", "source": {"type": "url", "url": "u"}}],
                    },
                ],
            },
        ],
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}],
    }
    found = [(p.where, p.kind, p.base64_only) for p in media_parts(body)]
    assert found == [
        ("messages[1].content[0].image_url.url", "image", False),
        ("messages[1].content[1].input_audio.data", "audio", True),
        ("messages[1].content[2].source.data", "image", True),
        ("messages[1].content[3].source.url", "image", False),
        ("messages[1].content[4].content[0].source.url", "image", False),
        ("input[0].content[0].image_url", "image", False),
    ]
    assert media_parts({"messages": [{"role": "user", "content": "hi"}], "input": "just text"}) == []


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}},
        {"type": "image_url", "image_url": {"url": PNG}},  # raw base64: llama-server takes it too
        {"type": "image_url", "image_url": "data:image/jpeg;base64," + PNG},  # the older string form
        {"type": "input_audio", "input_audio": {"data": PNG, "format": "mp3"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
    ],
)
def test_well_formed_media_passes(part: dict[str, Any]) -> None:
    refuse_unusable_media("v", _msg(part), has_projector=True, allow_remote=False)


@pytest.mark.parametrize(
    ("part", "says"),
    [
        (
            {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}},
            "allow_remote_media = true",
        ),
        (
            {"type": "image_url", "image_url": {"url": "HTTPS://127.0.0.1:8080/x"}},
            "remote image URLs are refused",
        ),
        ({"type": "input_image", "image_url": "https://10.0.0.1/x.png"}, "allow_remote_media"),
        ({"type": "image_url", "image_url": {"url": "file:///etc/shadow"}}, "file:// URLs are refused"),
        (
            {"type": "input_audio", "input_audio": {"data": "https://x/a.wav"}},
            "must be base64 data, not a URL",
        ),
        ({"type": "input_audio", "input_audio": {"data": "not base64!"}}, "the audio is not valid base64"),
        ({"type": "image", "source": {"type": "base64", "data": "%%%"}}, "the image is not valid base64"),
        ({"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}}, "is not a base64 image"),
        ({"type": "image_url", "image_url": {}}, "the image is empty"),
    ],
)
def test_remote_local_and_malformed_media_are_400s(part: dict[str, Any], says: str) -> None:
    with pytest.raises(RequestRejected) as exc:
        refuse_unusable_media("v", _msg(part), has_projector=True, allow_remote=False)
    assert exc.value.status_code == 400 and says in str(exc.value)


def test_remote_urls_pass_when_allowed_but_file_urls_never() -> None:
    remote = {"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}}
    refuse_unusable_media("v", _msg(remote), has_projector=True, allow_remote=True)
    local = {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}
    with pytest.raises(RequestRejected, match="file://"):
        refuse_unusable_media("v", _msg(local), has_projector=True, allow_remote=True)


def test_media_to_a_model_without_a_projector_names_the_model_and_the_key() -> None:
    part = {"type": "input_audio", "input_audio": {"data": PNG}}
    with pytest.raises(RequestRejected) as exc:
        refuse_unusable_media("chat", _msg(part), has_projector=False, allow_remote=False)
    text = str(exc.value)
    assert "model 'chat' cannot take audio input" in text and "[models.chat]" in text and "mmproj" in text
    refuse_unusable_media(
        "chat", {"messages": [{"role": "user", "content": "hi"}]}, has_projector=False, allow_remote=False
    )


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]},
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": PNG}]}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text"}]}]},
    ],
)
def test_a_body_with_parts_meets_the_media_check(body: dict[str, Any]) -> None:
    """The forwarder runs the media check only where :func:`has_parts` says a body has content
    parts: every body in which :func:`media_parts` finds media must say so."""
    assert has_parts(body)


def test_a_text_body_skips_the_media_check() -> None:
    assert not has_parts({"messages": [{"role": "user", "content": "hi"}], "input": "just text"})
    assert not has_parts({"prompt": "hi"})
    assert media_parts({"messages": [{"role": "user", "content": "hi"}], "input": "just text"}) == []
