"""Whether a model serves a forwarded route is checked once per configuration
(``proxy/_forwarder.check_fits``), not on every request: a reload that replaces the configuration
(here: the model becomes a reranker) is checked afresh."""

from __future__ import annotations

import pytest

from rocmforge_supervisor._errors import InvalidRequest
from rocmforge_supervisor.config import ModelConfig
from rocmforge_supervisor.service.proxy._forwarder import check_fits as _check_fits


def test_a_replaced_configuration_is_checked_again() -> None:
    chat = ModelConfig(path="m.gguf")
    _check_fits("fit-m", chat, "/v1/chat/completions")
    _check_fits("fit-m", chat, "/v1/chat/completions")  # the same configuration: passes again
    reranker = ModelConfig(path="m.gguf", rerank=True)
    with pytest.raises(InvalidRequest, match="is a reranker"):
        _check_fits("fit-m", reranker, "/v1/chat/completions")
    with pytest.raises(InvalidRequest, match="is a reranker"):  # a refusal is not remembered
        _check_fits("fit-m", reranker, "/v1/chat/completions")
    _check_fits("fit-m", reranker, "/v1/rerank")
    with pytest.raises(InvalidRequest, match="does not rerank"):
        _check_fits("fit-m", chat, "/v1/rerank")
