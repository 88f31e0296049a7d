"""``/metrics`` and API keys: a key that is not an admin sees only its own key's usage series, as
the activity API shows it only its own rows and usage; an admin key sees every key's."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import chat

pytestmark = pytest.mark.anyio

KEYS = [
    {"name": "alice", "key": "alice-secret"},
    {"name": "bob", "key": "bob-secret"},
    {"name": "root", "key": "root-secret", "admin": True},
]


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _key_series(text: str) -> dict[str, set[str]]:
    """family → the ``key`` label values of its samples, for the per-key families."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("forge_key_"):
            out[family.name] = {s.labels["key"] for s in family.samples if "key" in s.labels}
    return out


async def test_a_non_admin_key_sees_only_its_own_usage_series_and_an_admin_every_key(serve: Serve) -> None:
    async with serve({"m": {"preload": True}}, server={"keys": KEYS}) as gw:
        path, body = chat("openai", "m", stream=False)
        for secret in ("alice-secret", "bob-secret"):
            r = await gw.client.post(path, json=body, headers=_bearer(secret))
            assert r.status_code == 200, r.text

        admin = await gw.client.get("/metrics", headers=_bearer("root-secret"))
        assert admin.status_code == 200
        assert _key_series(admin.text)["forge_key_requests"] >= {"alice", "bob"}

        alice = await gw.client.get("/metrics", headers=_bearer("alice-secret"))
        assert alice.status_code == 200
        assert _key_series(alice.text)["forge_key_requests"] == {"alice"}
        assert "bob" not in alice.text and "root" not in alice.text
        # The rest of the exposition is the same for every caller (no key in it).
        assert "forge_requests_total" in alice.text and "forge_model_state" in alice.text

        assert (await gw.client.get("/metrics")).status_code == 401  # and no key: no metrics


async def test_with_metrics_public_a_key_still_sees_only_its_own_series_and_no_key_none(serve: Serve) -> None:
    """``metrics_public`` lets a scraper in without a key; it does not hand out other keys' names:
    a key sent along still counts (a non-admin one sees its own series), no key sees none."""
    async with serve({"m": {"preload": True}}, server={"keys": KEYS, "metrics_public": True}) as gw:
        path, body = chat("openai", "m", stream=False)
        for secret in ("alice-secret", "bob-secret"):
            r = await gw.client.post(path, json=body, headers=_bearer(secret))
            assert r.status_code == 200, r.text

        alice = await gw.client.get("/metrics", headers=_bearer("alice-secret"))
        assert alice.status_code == 200
        assert _key_series(alice.text)["forge_key_requests"] == {"alice"} and "bob" not in alice.text

        anonymous = await gw.client.get("/metrics")
        assert anonymous.status_code == 200 and "forge_model_state" in anonymous.text
        assert not any(_key_series(anonymous.text).values()), _key_series(anonymous.text)
        assert "alice" not in anonymous.text and "bob" not in anonymous.text

        wrong = await gw.client.get("/metrics", headers=_bearer("not-a-key"))
        assert wrong.status_code == 200 and "alice" not in wrong.text  # public, as anonymous

        admin = await gw.client.get("/metrics", headers=_bearer("root-secret"))
        assert _key_series(admin.text)["forge_key_requests"] >= {"alice", "bob"}
