"""A key scoped to some models is shown only those, in every listing (``/v1/models``, Ollama's
``/api/tags``, the control API's ``/api/models`` that the page reads); retrieving another one is the
403 a request to it would be. An admin key sees every model in the control listing, and the control
listing says whether the caller is an admin (the page shows its controls to admins only)."""

from __future__ import annotations

import pytest

from tests.gateway_fast.conftest import Serve

pytestmark = pytest.mark.anyio

KEYS = [
    {"name": "alice", "key": "alice-secret", "models": ["a"]},
    {"name": "root", "key": "root-secret", "admin": True},
]


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_a_scoped_key_lists_only_its_models(serve: Serve) -> None:
    async with serve({"a": {}, "b": {}, "c": {}}, server={"keys": KEYS}) as gw:
        alice, root = _bearer("alice-secret"), _bearer("root-secret")

        v1 = (await gw.client.get("/v1/models", headers=alice)).json()
        assert [m["id"] for m in v1["data"]] == ["a"]
        tags = (await gw.client.get("/api/tags", headers=alice)).json()
        assert [m["name"].split(":")[0] for m in tags["models"]] == ["a"]
        control = (await gw.client.get("/api/models", headers=alice)).json()
        assert [m["name"] for m in control["models"]] == ["a"]
        assert control["key"] == {"name": "alice", "admin": False}

        other = await gw.client.get("/v1/models/b", headers=alice)
        assert other.status_code == 403 and "alice" in other.text and "'b'" in other.text, other.text
        assert (await gw.client.get("/v1/models/a", headers=alice)).status_code == 200

        everything = (await gw.client.get("/api/models", headers=root)).json()
        assert sorted(m["name"] for m in everything["models"]) == ["a", "b", "c"]
        assert everything["key"] == {"name": "root", "admin": True}
        assert sorted(m["id"] for m in (await gw.client.get("/v1/models", headers=root)).json()["data"]) == [
            "a",
            "b",
            "c",
        ]


async def test_without_keys_every_model_is_listed_and_no_key_is_named(serve: Serve) -> None:
    async with serve({"a": {}, "b": {}}) as gw:
        assert [m["id"] for m in (await gw.client.get("/v1/models")).json()["data"]] == ["a", "b"]
        control = (await gw.client.get("/api/models")).json()
        assert [m["name"] for m in control["models"]] == ["a", "b"] and control["key"] is None
