"""A key scoped to some models learns nothing of the others, on every route the app serves.

The matrix is the app's own route table (``app.routes``) against the product's visibility table
(``service/core/_visibility.ROUTES``): a served route without a class fails here the day it is
added, and every class is checked by what it promises, with two models loaded and used (one in
the scoped key's models, one not), both with events, activity rows and metric series:

- public: answers without a key, and names no hidden model;
- admin: the scoped key gets the 403 ``admin_required``;
- any key: answers the scoped key, names no hidden model;
- scoped: the scoped key's answer names its model and not the other; an admin key's names both;
- own: the scoped key gets none of the admin's records (404, or the 403 for another key's); the
  admin gets its own, which name the hidden model;
- model: the hidden model is the model routes' 403 ``model_not_allowed``, the key's model is
  served (not 401/403), and an unknown name's error does not list the hidden model.

Against the FAKE llama-server; the event stream is read until an event the test causes, under a
deadline (no fixed sleep).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest
from starlette.routing import BaseRoute, Mount, Route

from rocmforge_supervisor.access import Key
from rocmforge_supervisor.batches import BatchStore
from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.service.control._page import PAGE_PATHS
from rocmforge_supervisor.service.core._routes import FORWARDED
from rocmforge_supervisor.service.core._visibility import ROUTES, ModelScope, Visibility, visibility_of
from rocmforge_supervisor.supervisor import Supervisor
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import HELLO
from tests.support.gateway import Gateway, serving
from tests.support.supervised import fake_config

pytestmark = pytest.mark.anyio

#: Names that appear nowhere in the service's own text (its page, its API document).
VISIBLE, HIDDEN, UNKNOWN = "kept-7b", "ghost-stt", "nowhere-3b"
KEYS = [
    {"name": "scoped", "key": "scoped-secret", "models": [VISIBLE]},
    {"name": "root", "key": "root-secret", "admin": True},
]
SCOPED = {"Authorization": "Bearer scoped-secret"}
ADMIN = {"Authorization": "Bearer root-secret"}
NOBODY: dict[str, str] = {}

#: The query a probe of the route adds: the event stream from its history, usage per model.
QUERY = {"/api/events": "replay=1", "/api/usage": "by=model"}
_FORM_MODEL = {r.path for r in FORWARDED if r.model_from == "form"}
_QUERY_MODEL = {r.path for r in FORWARDED if r.model_from == "query"}


def served(routes: list[BaseRoute]) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves (``HEAD`` follows ``GET``; a mount is one
    ``GET``); anything else is listed as it is, so that it fails the table lookup."""
    out: list[tuple[str, str]] = []
    for route in routes:
        if isinstance(route, Route):
            out += [(m, route.path) for m in sorted((route.methods or {"GET"}) - {"HEAD"})]
        elif isinstance(route, Mount):
            out.append(("GET", route.path))
        else:
            out.append(("?", repr(route)))
    return out


@dataclass(frozen=True)
class Records:
    """The admin's records, which name the hidden model, and the scoped key's own row."""

    admin_row: int
    own_row: int
    file_id: str
    batch_id: str


@dataclass(frozen=True)
class Answer:
    """A route's status and body (an event stream's: the events read)."""

    status: int
    text: str

    def names(self, model: str) -> bool:
        return model in self.text


async def _call(
    gw: Gateway, method: str, path: str, model: str, rec: Records, headers: dict[str, str]
) -> Answer:
    """One request to route ``path`` with its parameters filled: ``model`` where the route names a
    model (path, query, form or JSON body), the admin's records where it names one."""
    url = (
        path.replace("{model_id:path}", model)
        .replace("{name}", model)
        .replace("{ident:int}", str(rec.admin_row))
        .replace("{file_id}", rec.file_id)
        .replace("{batch_id}", rec.batch_id)
    )
    assert "{" not in url, f"{path}: a path parameter this test does not fill yet; teach _call it"
    query = QUERY.get(path, "")
    kw: dict[str, Any] = {}
    if path in _QUERY_MODEL:
        query = f"model={model}"
    elif path in _FORM_MODEL:
        kw = {"files": {"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}, "data": {"model": model}}
    elif method == "POST":  # a body each kind of route takes (a field check may come before the model's)
        body = {"model": model, "messages": HELLO, "max_tokens": 4}
        kw = {"json": {**body, "input_file_id": rec.file_id, "endpoint": "/v1/chat/completions"}}
    if query:
        url = f"{url}?{query}"
    if path == "/api/events":
        return await _events(gw, url, headers)
    try:
        with anyio.fail_after(15):
            r = await gw.client.request(method, url, headers=headers, **kw)
    except TimeoutError:
        raise AssertionError(
            f"{method} {path}: no answer in 15 s (endless? read it as _events does)"
        ) from None
    return Answer(r.status_code, r.text)


async def _events(gw: Gateway, url: str, headers: dict[str, str]) -> Answer:
    """The event stream: its replay of the history (both models' loads), then a config reload's
    event (the service's own, which every caller sees) that the test causes once connected, so it
    comes after every replayed one; read until that, under a deadline (the stream is endless)."""
    before = gw.sup.events.history()[-1].seq
    seen: list[str] = []
    with anyio.fail_after(10):
        async with gw.client.stream("GET", url, headers=headers) as r:
            if r.status_code != 200:
                return Answer(r.status_code, (await r.aread()).decode())
            lines = r.aiter_lines()
            assert await anext(lines) == ": connected"
            reload = await gw.client.post("/api/reload", headers=ADMIN)
            assert reload.status_code == 200, reload.text
            async for line in lines:
                if line.startswith("data: "):
                    seen.append(line)
                    event = json.loads(line[6:])
                    if event["kind"] == "config" and event["seq"] > before:
                        break
    return Answer(200, "\n".join(seen))


def _check(vis: Visibility, method: str, path: str, asked: dict[str, Answer], problems: list[str]) -> None:
    """What ``vis`` promises, from the answers of one route (by who asked what)."""

    def want(cond: bool, what: str, who: str) -> None:
        if not cond:
            a = asked[who]
            problems.append(f"{method} {path} [{vis}]: {what} (as {who}: {a.status} {a.text[:300]!r})")

    for who, a in asked.items():
        if who != "scoped, hidden model" and who.startswith("scoped"):
            want(not a.names(HIDDEN), f"names {HIDDEN!r}", who)
        want(a.status != 500, "an internal error", who)  # (a 502/503 is the fake child's answer)
    if vis == Visibility.PUBLIC:
        want(asked["anonymous"].status != 401, "asks for a key", "anonymous")
    elif vis == Visibility.ADMIN:
        a = asked["scoped"]
        want(a.status == 403 and "admin key" in a.text, "not refused for an admin key", "scoped")
    elif vis == Visibility.ANY_KEY:
        want(asked["anonymous"].status == 401, "answers without a key", "anonymous")
        want(asked["scoped"].status == 200, "refused", "scoped")
    elif vis == Visibility.SCOPED:
        want(asked["anonymous"].status == 401, "answers without a key", "anonymous")
        want(asked["scoped"].status == 200 and asked["scoped"].names(VISIBLE), f"lacks {VISIBLE!r}", "scoped")
        admin = asked["admin"]
        want(admin.status == 200 and admin.names(VISIBLE) and admin.names(HIDDEN), "lacks a model", "admin")
    elif vis == Visibility.OWN:
        want(asked["scoped"].status in (200, 400, 403, 404), "not an answer about its own records", "scoped")
        if method == "GET":  # the admin's own records name the hidden model
            want(asked["admin"].status == 200 and asked["admin"].names(HIDDEN), "lacks its record", "admin")
    elif vis == Visibility.MODEL:
        a = asked["scoped, hidden model"]
        want(
            a.status == 403 and "may not use model" in a.text,
            "not the model routes' 403",
            "scoped, hidden model",
        )
        want(asked["scoped"].status not in (401, 403), "refused its own model", "scoped")


async def _records(gw: Gateway) -> Records:
    """Requests to both models (the admin's) and to the key's own (the scoped key's), a refused
    one of the scoped key to the hidden model (its own row, which it must not be shown either),
    and the admin's file and batch that name the hidden model."""
    for model, headers in ((HIDDEN, ADMIN), (VISIBLE, ADMIN), (VISIBLE, SCOPED)):
        r = await gw.client.post(
            "/v1/chat/completions", json={"model": model, "messages": HELLO, "stream": False}, headers=headers
        )
        assert r.status_code == 200, r.text
    refused = await gw.client.post(
        "/v1/chat/completions", json={"model": HIDDEN, "messages": HELLO}, headers=SCOPED
    )
    assert refused.status_code == 403, refused.text
    line = {"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": HIDDEN}}
    upload = await gw.client.post(
        "/v1/files",
        files={"file": (f"{HIDDEN}.jsonl", json.dumps(line).encode() + b"\n", "application/jsonl")},
        data={"purpose": "batch"},
        headers=ADMIN,
    )
    assert upload.status_code == 200, upload.text
    batch = await gw.client.post(
        "/v1/batches",
        json={
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/chat/completions",
            "metadata": {"for": HIDDEN},
        },
        headers=ADMIN,
    )
    assert batch.status_code == 200, batch.text
    admin_rows = (await gw.client.get(f"/api/activity?model={HIDDEN}&key=root", headers=ADMIN)).json()[
        "activity"
    ]
    own_rows = (await gw.client.get("/api/activity", headers=SCOPED)).json()["activity"]
    assert [r["model"] for r in own_rows] == [VISIBLE], own_rows  # its refused row is not shown
    return Records(admin_rows[0]["id"], own_rows[0]["id"], upload.json()["id"], batch.json()["id"])


async def test_every_served_route_has_exactly_one_visibility_class(serve: Serve) -> None:
    async with serve({VISIBLE: {}}, server={"keys": KEYS}) as gw:
        routes = served(gw.state.app.routes)
    missing = [f"{m} {p}" for m, p in routes if visibility_of(m, p) is None]
    assert not missing, f"routes without a class in service/core/_visibility.ROUTES: {missing}"
    stale = sorted(f"{m} {p}" for m, p in set(ROUTES) - set(routes))
    assert not stale, f"ROUTES lists routes the app does not serve: {stale}"


async def test_a_scoped_key_sees_nothing_of_another_model_on_any_route(
    tmp_path: Path, tiny_gguf: Path, fake_bin: Path
) -> None:
    models = {HIDDEN: {"preload": True}, VISIBLE: {"preload": True}}
    config = fake_config(tmp_path, tiny_gguf, models, server={"keys": KEYS})
    async with serving(config, fake_bin, reload_to=lambda: config, timeout=90) as gw:
        gw.state.batches = BatchStore(tmp_path / "batches")
        try:
            rec = await _records(gw)
            problems: list[str] = []
            routes = served(gw.state.app.routes)
            for method, path in routes:
                vis = visibility_of(method, path)
                assert vis is not None, f"{method} {path} has no visibility class"
                asked: dict[str, Answer] = {}
                if path == "/ui":  # the page's files: each, without a key
                    for page in sorted(PAGE_PATHS):
                        r = await gw.client.get(page)
                        assert r.status_code == 200 and HIDDEN not in r.text, page
                    asked["anonymous"] = Answer(200, "")
                    asked["scoped"] = Answer(200, "")
                else:
                    asked["anonymous"] = await _call(gw, method, path, VISIBLE, rec, NOBODY)
                    asked["scoped"] = await _call(gw, method, path, VISIBLE, rec, SCOPED)
                if vis == Visibility.MODEL:
                    asked["scoped, hidden model"] = await _call(gw, method, path, HIDDEN, rec, SCOPED)
                    asked["scoped, unknown model"] = await _call(gw, method, path, UNKNOWN, rec, SCOPED)
                if vis in (Visibility.SCOPED, Visibility.OWN) and (
                    vis == Visibility.SCOPED or method == "GET"
                ):
                    asked["admin"] = await _call(gw, method, path, VISIBLE, rec, ADMIN)
                _check(vis, method, path, asked, problems)
            own = await gw.client.get(f"/api/activity/{rec.own_row}", headers=SCOPED)
            assert own.status_code == 200 and own.json()["model"] == VISIBLE, own.text
        finally:
            gw.state.batches.close()
    assert not problems, "\n".join(problems)


async def test_live_events_of_another_model_do_not_reach_a_scoped_key(
    tmp_path: Path, tiny_gguf: Path, fake_bin: Path
) -> None:
    """Events published while the stream is open are filtered as the replay is: the hidden
    model's unload is not seen, the key's own model's is; a reload that removes the hidden model
    says so to the admin only (a removed model is no longer configured: judged by name)."""
    models = {HIDDEN: {"preload": True}, VISIBLE: {"preload": True}}
    config = fake_config(tmp_path, tiny_gguf, models, server={"keys": KEYS})

    def without_hidden() -> ForgeConfig:
        return fake_config(tmp_path, tiny_gguf, {VISIBLE: {}}, server={"keys": KEYS})

    async with serving(config, fake_bin, reload_to=without_hidden, timeout=60) as gw:
        raw: list[str] = []
        with anyio.fail_after(15):
            async with gw.client.stream("GET", "/api/events", headers=SCOPED) as stream:
                lines = stream.aiter_lines()
                assert await anext(lines) == ": connected"
                for model in (HIDDEN, VISIBLE):
                    r = await gw.client.post(f"/api/models/{model}/unload", headers=ADMIN)
                    assert r.status_code == 200, r.text
                r = await gw.client.post("/api/reload", headers=ADMIN)
                assert r.status_code == 200 and r.json()["removed"] == [HIDDEN], r.text
                async for line in lines:
                    if line.startswith("data: "):
                        raw.append(line)
                        if json.loads(line[6:])["kind"] == "config":
                            break
    seen = [json.loads(line[6:]) for line in raw]
    assert {ev["model"] for ev in seen} == {VISIBLE, "*"}, seen
    assert seen[-1]["data"]["changes"]["removed"] == [] and seen[-1]["data"]["changes"]["unchanged"] == [
        VISIBLE
    ]
    assert not any(HIDDEN in line for line in raw), raw


@dataclass(frozen=True)
class _Configured:
    """What :class:`ModelScope` reads of the supervisor: the models' names and served names."""

    models: dict[str, tuple[str, ...]]

    def names(self) -> list[str]:
        return list(self.models)

    def config_of(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(variants=self.models[name], adapters=())


def test_text_that_names_a_hidden_model_is_redacted_for_a_scoped_key() -> None:
    """The redaction the events' data and the errors get: a list item is left out, another
    mention says "another model"; a visible name that merely starts like a hidden one is kept, and
    a variant of a hidden model is hidden with it."""
    key = Key("scoped", b"s", models=("qwen2.5",))
    sup = cast(Supervisor, _Configured({"qwen2": ("json",), "qwen2.5": (), "stt": ()}))
    seen = ModelScope(key, sup)
    assert seen.redact("known models: qwen2, qwen2.5, stt") == "known models: qwen2.5"
    assert seen.redact("known models: stt") == "known models: another model"
    assert seen.redact("evicted for stt") == "evicted for another model"
    assert seen.redact("models.stt.path is not a file") == "models.another model.path is not a file"
    assert seen.redact("qwen2.5 and qwen2:json") == "qwen2.5 and another model"
    assert seen.redact("qwen2.5 is ready") == "qwen2.5 is ready"
    assert seen.filtered({"preloaded": ["stt", "qwen2.5"], "stt": 1, "for_model": "qwen2"}) == {
        "preloaded": ["qwen2.5"],
        "for_model": "another model",
    }
    assert not seen.sees("qwen2:json") and seen.sees("qwen2.5") and not seen.sees("gone")
    for everything in (ModelScope(None, sup), ModelScope(Key("root", b"r", admin=True), sup)):
        assert everything.redact("known models: qwen2, qwen2.5, stt") == "known models: qwen2, qwen2.5, stt"
        assert everything.sees("stt") and everything.sees("gone")
