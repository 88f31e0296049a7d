"""`forge inspect` as a user runs it (real subprocess, real files)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rocmforge_supervisor.models import estimate_memory, inspect_gguf

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]


def forge(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([*FORGE, *args], capture_output=True, text=True, env=env, timeout=60)


def test_inspect_embedded_model_by_name(gemma_path: Path) -> None:
    r = forge("inspect", "gemma-3-270m")
    assert r.returncode == 0, r.stderr
    for text in (
        "gemma3",
        "Q4_K_M",
        "32,768",
        "262,144",
        "512 tokens on 15 of 18 layers",
        "estimate: ctx 32,768",
    ):
        assert text in r.stdout, text


def test_inspect_json_with_estimate(gemma_path: Path) -> None:
    r = forge("inspect", str(gemma_path), "--ctx-size", "4096", "--parallel", "1", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["architecture"] == "gemma3" and data["block_count"] == 18
    assert data["head_count_kv"] == 1 and data["file_size_bytes"] == gemma_path.stat().st_size
    est = data["estimate"]
    expected = estimate_memory(inspect_gguf(gemma_path), n_gpu_layers=None, ctx_size=4096, parallel=1)
    assert est["total_bytes"] == expected.total_bytes
    assert est["ctx_size"] == 4096 and est["parallel"] == 1
    assert set(est["by_device"]) == {"cpu"}
    for part in ("weights_bytes", "kv_bytes", "compute_bytes"):
        assert est[part] > 0


def test_inspect_gpu_estimate(gemma_path: Path) -> None:
    r = forge("inspect", str(gemma_path), "-c", "2048", "--gpu", "amd:0,amd:1", "--json")
    assert r.returncode == 0, r.stderr
    by_device = json.loads(r.stdout)["estimate"]["by_device"]
    assert set(by_device) == {"cpu", "amd:0", "amd:1"}
    assert by_device["amd:0"]["layers"] + by_device["amd:1"]["layers"] == 18


def test_inspect_with_embeddings(smollm2_path: Path) -> None:
    """The estimate as served with ``embeddings = true``: a ubatch of logits in the compute buffer
    (what the real child allocates: tests/models/test_estimate_real.py)."""
    args = ("inspect", str(smollm2_path), "-c", "4096", "-np", "4", "--json")
    plain = json.loads(forge(*args).stdout)["estimate"]
    r = forge(*args, "--embeddings")
    assert r.returncode == 0, r.stderr
    emb = json.loads(r.stdout)["estimate"]
    assert emb["embeddings"] is True and plain["embeddings"] is False
    assert emb["compute_bytes"] >= 512 * 49152 * 4 > plain["compute_bytes"]
    assert "embeddings" in forge("inspect", str(smollm2_path), "--embeddings").stdout


def test_inspect_split_model(split_tiny: list[Path]) -> None:
    r = forge("inspect", str(split_tiny[1]), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["split_files"] == [str(p) for p in split_tiny]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cache-type-k", "q3"], "is not a KV cache type"),
        (["--ctx-size", "-5"], "--ctx-size must be >= 0"),
    ],
)
def test_inspect_bad_options(tiny_gguf: Path, args: list[str], needle: str) -> None:
    r = forge("inspect", str(tiny_gguf), *args)
    assert r.returncode == 2 and needle in r.stderr


def test_inspect_bad_files(tmp_path: Path, tiny_gguf: Path) -> None:
    notes = tmp_path / "notes.gguf"
    notes.write_text("not a model\n")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-5000])
    whisper = tmp_path / "ggml-tiny.bin"  # whisper.cpp's header: the ggml magic, then its hparams
    whisper.write_bytes(struct.pack("<11i", 0x67676D6C, 51865, 1500, 384, 6, 4, 448, 384, 6, 4, 1))
    for path, needle in (
        (notes, "is not a GGUF model"),
        (
            whisper,
            'is a whisper.cpp (GGML) model, not a GGUF one: llama-server cannot load it — serve it with forge serve: [models.NAME] path = "…" backend = "whisper"',
        ),
        (cut, "is truncated"),
        (tmp_path / "nope.gguf", "no model file"),
    ):
        r = forge("inspect", str(path))
        assert r.returncode == 2, r.stderr
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
        assert "Traceback" not in r.stderr


def test_inspect_shows_the_projector_beside_a_model_and_counts_it_when_asked(vision_model: Path) -> None:
    r = forge("inspect", str(vision_model), "--ctx-size", "512", "--parallel", "1")
    assert r.returncode == 0, r.stderr
    assert "projector (mmproj)" in r.stdout and "mmproj-tiny-vision.gguf" in r.stdout
    assert "mlp, takes vision" in r.stdout and "32 px, 8 px patches" in r.stdout
    assert "projector MiB" not in r.stdout  # shown, not counted
    shown = json.loads(forge("inspect", str(vision_model), "--json").stdout)
    assert shown["projector"]["modalities"] == ["vision"] and shown["projector"]["counted"] is False
    assert shown["estimate"]["projector_bytes"] == 0
    counted = forge("inspect", str(vision_model), "--mmproj", "auto", "--gpu", "amd:0", "--json")
    assert counted.returncode == 0, counted.stderr
    data = json.loads(counted.stdout)
    p = data["projector"]
    assert (
        data["estimate"]["by_device"]["amd:0"]["projector_bytes"] == p["weights_bytes"] + p["compute_bytes"]
    )
    in_ram = json.loads(
        forge(
            "inspect",
            str(vision_model),
            "--mmproj",
            "auto",
            "--gpu",
            "amd:0",
            "--no-mmproj-offload",
            "--json",
        ).stdout
    )
    assert in_ram["estimate"]["by_device"]["cpu"]["projector_bytes"] > 0
    table = forge("inspect", str(vision_model), "--mmproj", "auto")
    assert "projector MiB" in table.stdout


def test_inspect_refuses_a_model_given_as_mmproj(vision_model: Path, tiny_gguf: Path) -> None:
    r = forge("inspect", str(vision_model), "--mmproj", str(tiny_gguf))
    assert r.returncode != 0
    assert "is not a multimodal projector" in r.stderr
