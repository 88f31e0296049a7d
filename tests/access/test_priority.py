"""A request's admission class: the key's ``priority``, ``X-Priority`` honoured only downward for
a key that is not an admin (``access._keys``)."""

from __future__ import annotations

import pytest

from rocmforge_supervisor._errors import InvalidRequest, KeyForbidden
from rocmforge_supervisor.access import Key, KeyRing, request_class
from rocmforge_supervisor.config import ServerConfig

BATCH = Key("night", b"s1", priority="batch")
INTERACTIVE = Key("chat", b"s2")
ADMIN = Key("ops", b"s3", admin=True, priority="background")


def test_the_key_decides_without_a_header() -> None:
    assert request_class(BATCH, None) == "batch"
    assert request_class(INTERACTIVE, None) == "interactive"
    assert request_class(None, None) == "interactive"
    assert request_class(BATCH, "  ") == "batch"


def test_a_header_may_lower_the_class() -> None:
    assert request_class(INTERACTIVE, "batch") == "batch"
    assert request_class(INTERACTIVE, "Background") == "background"
    assert request_class(BATCH, "background") == "background"
    assert request_class(BATCH, "batch") == "batch"


def test_a_header_may_not_raise_a_plain_keys_class() -> None:
    with pytest.raises(KeyForbidden, match="'night' may not raise its requests to 'interactive'") as e:
        request_class(BATCH, "interactive")
    assert e.value.hint is not None and "X-Priority: batch" in e.value.hint


def test_an_admin_key_may_raise_it() -> None:
    assert request_class(ADMIN, None) == "background"
    assert request_class(ADMIN, "interactive") == "interactive"


def test_without_keys_any_class_may_be_asked() -> None:
    assert request_class(None, "background") == "background"
    assert request_class(None, "interactive") == "interactive"


def test_an_unknown_class_is_a_400_naming_the_classes() -> None:
    with pytest.raises(InvalidRequest, match="'urgent' is not a priority class") as e:
        request_class(INTERACTIVE, "urgent")
    assert e.value.hint is not None and "interactive, batch, background" in e.value.hint


def test_the_key_setting_comes_from_the_config() -> None:
    server = ServerConfig.model_validate({"keys": [{"name": "night", "key": "sk-n", "priority": "batch"}]})
    (key,) = KeyRing.from_config(server).keys
    assert key.priority == "batch"


def test_an_unknown_key_priority_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="priority"):
        ServerConfig.model_validate({"keys": [{"name": "n", "key": "k", "priority": "urgent"}]})
