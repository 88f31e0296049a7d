"""The Python API's own argument errors are of the one hierarchy (``ForgeError``, a usage error
with its fix) and still the built-in kind Python code expects: a bad value is a ``ValueError``,
a closed model a ``RuntimeError``. Nothing here reaches a server."""

from __future__ import annotations

import pytest

from rocmforge_supervisor import (
    ForgeError,
    GenerateOptions,
    InvalidArgument,
    ModelClosed,
    TextModel,
    UsageError,
)


@pytest.mark.parametrize("url", ["not a url", "127.0.0.1:8080", "ftp://host", ""])
def test_a_url_without_its_scheme_is_an_invalid_argument(url: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        TextModel.connect(url)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, UsageError)
    assert repr(url) in str(caught.value) and "http://127.0.0.1:8080" in str(caught.value)


def test_a_negative_length_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match=r"max_tokens must be >= 0, got -5 — use 0 or more"):
        GenerateOptions(max_tokens=-5).to_body()


def test_a_closed_model_says_so_before_any_request() -> None:
    model = TextModel.connect("http://127.0.0.1:9", model="m")  # nothing listens: never asked
    model.close()
    for use in (lambda: next(iter(model.generate("hi"))), lambda: next(iter(model.chat([])))):
        with pytest.raises(ModelClosed) as caught:
            use()
        assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, ForgeError)
        assert str(caught.value) == "this TextModel is closed — load or connect a new one"
    model.close()  # twice is fine
