"""A LoRA adapter judged against its base model before anything starts (``models/_adapter.py``),
and its memory: counted as weights where its layers are, checked against what the real
llama-server allocated for it (its ``LoRA buffer size`` log line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor._errors import ConfigError
from rocmforge_supervisor.models import adapter_mismatch, check_adapter, estimate_memory, inspect_gguf
from tests.models.test_estimate_real import _actual
from tests.support.lora import write_lora


def test_an_adapter_made_for_the_model_fits(smollm2_path: Path, tmp_path: Path) -> None:
    assert adapter_mismatch(smollm2_path, write_lora(tmp_path / "a.gguf", smollm2_path)) is None


def test_an_adapter_for_another_architecture_or_width_is_refused_naming_both(
    smollm2_path: Path, gemma_path: Path, tmp_path: Path
) -> None:
    lora = write_lora(tmp_path / "smol-lora.gguf", smollm2_path)
    with pytest.raises(ConfigError) as err:
        check_adapter(gemma_path, lora, key="models.g.adapters.smol")
    message = str(err.value)
    assert "\n" not in message
    assert "smol-lora.gguf" in message and gemma_path.name in message and "models.g.adapters.smol" in message
    assert "'llama' architecture, the model is 'gemma3'" in message

    wide = write_lora(tmp_path / "wide.gguf", smollm2_path, embedding=640)
    why = adapter_mismatch(smollm2_path, wide)
    assert why is not None and "640x576" in why and "embedding size is 576" in why
    # A model file as the adapter: not a LoRA at all.
    assert "no LoRA adapter" in (adapter_mismatch(smollm2_path, gemma_path) or "")


def test_the_estimate_counts_adapters_as_the_child_allocates_them(
    smollm2_path: Path,
    llama_server_bin: Path,
    llama_server_flags: tuple[str, ...],
    tmp_path: Path,
) -> None:
    a = write_lora(tmp_path / "a.gguf", smollm2_path, seed=1)
    b = write_lora(tmp_path / "b.gguf", smollm2_path, seed=2, rank=16, targets=("attn_q", "attn_k", "ffn_up"))
    args = ["-c", "2048", "-np", "1", *llama_server_flags]
    plain = _actual(llama_server_bin, smollm2_path, args)
    with_lora = _actual(
        llama_server_bin, smollm2_path, [*args, "--lora", f"{a},{b}", "--lora-init-without-apply"]
    )
    actual = with_lora.part_totals()["weights"] - plain.part_totals()["weights"]
    info = inspect_gguf(smollm2_path)
    files = a.stat().st_size + b.stat().st_size

    def weights(adapter_bytes: int) -> int:
        est = estimate_memory(
            info, n_gpu_layers=0, ctx_size=2048, parallel=1, adapter_bytes=adapter_bytes,
            repack="--no-repack" not in args,
        )  # fmt: skip
        return est.weights_bytes

    counted = weights(files) - weights(0)
    assert counted == files
    assert abs(counted - actual) <= 0.02 * actual, (counted, actual)
