"""The flag vocabulary's builders that other packages call (``_argv``): RPC workers, probes, and
the one list of embedding architectures both the launch and the Ollama listings read."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._argv import EMBEDDING_ARCHITECTURES, embedding_args, probe_argv, rpc_args
from rocmforge_supervisor.service.proxy._model_card import ModelCard, capabilities


def test_rpc_args_name_the_workers_then_the_split() -> None:
    assert rpc_args(["10.0.0.53:50053", "10.0.0.54:50053"], (0.25, 0.75)) == [
        "--rpc", "10.0.0.53:50053,10.0.0.54:50053", "--tensor-split", "0.25,0.75",
    ]  # fmt: skip
    assert rpc_args([], (1.0, 1.0)) == ["--tensor-split", "1,1"]  # local GPUs only: no --rpc
    assert rpc_args([]) == []


def test_probe_argv_asks_the_version_or_the_devices(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    assert probe_argv(binary, version=True) == [str(binary), "--version"]
    assert probe_argv(binary) == [str(binary), "--list-devices"]
    assert probe_argv(binary, rpc="h:1") == [str(binary), "--rpc", "h:1", "--list-devices"]


def _card(architecture: str) -> ModelCard:
    return ModelCard(
        path=Path("m.gguf"), size=1, modified_at="", digest="", architecture=architecture,
        parameter_count=1, parameter_size="1", quantization="Q4_0", trained_ctx=512,
        embedding_length=8, template="", fim=False, pooling=False,
    )  # fmt: skip


@pytest.mark.parametrize("architecture", sorted(EMBEDDING_ARCHITECTURES))
def test_an_embedding_architecture_is_one_everywhere(architecture: str) -> None:
    # The launch leaves its pooling alone, and Ollama's listings give it no completion capability:
    # the two read the same list (they had drifted apart: gemma-embedding was in one only).
    assert embedding_args(True, [], architecture) == ["--embeddings"]
    assert capabilities(_card(architecture), [], ()) == ["embedding"]


def test_a_text_model_completes_and_gets_a_pooling() -> None:
    assert capabilities(_card("llama"), [], ()) == ["completion"]
    assert "--pooling" in embedding_args(True, [], "llama")
